// Builds plugin.js (with sdk/js/herald-plugin.js) into a herald:plugin@0.2.0
// component at plugins/target/example/js.wasm.
//
// Two steps: esbuild bundles plugin.js and what it imports into one ES
// module (.build/plugin.bundle.js, kept for reading a stack trace's line
// numbers), then componentize-js builds that against the WIT folder
// ($HERALD_WIT, default sdk/wit) and world `plugin`. StarlingMonkey resolves
// relative imports itself only inside the folder it is built from, and no
// npm packages at all: bundling first makes both work.
import { componentize } from "@bytecodealliance/componentize-js";
import { build } from "esbuild";
import { mkdir, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../..");
const wit = resolve(process.env.HERALD_WIT || join(repo, "sdk/wit"));
const out = join(repo, "plugins/target/example/js.wasm");
const bundle = join(here, ".build/plugin.bundle.js");

const t0 = Date.now();
await build({
  entryPoints: [join(here, "plugin.js")],
  outfile: bundle,
  bundle: true,
  format: "esm",
  platform: "neutral",
  target: "es2022",
  // Provided by the component's imports, not files.
  external: ["herald:*", "wasi:*"],
  logLevel: "warning",
});
const { component } = await componentize({
  sourcePath: bundle,
  witPath: wit,
  worldName: "plugin",
  // No fetch. stdio (console.log), random (crypto.getRandomValues) and
  // clocks (Date.now) stay: SPEC's PRINT, RAND and TIME use them, and the
  // host gives every plugin these WASI interfaces.
  disableFeatures: ["http", "fetch-event"],
});
await mkdir(dirname(out), { recursive: true });
await writeFile(out, component);
console.log(`${out}: ${component.length} bytes in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

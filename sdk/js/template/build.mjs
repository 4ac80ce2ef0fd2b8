// Builds plugin.js (or plugin.ts) into a Herald plugin component at
// dist/plugin.wasm.
//
// esbuild bundles plugin.js, herald-plugin.js and any npm package they
// import into one ES module (.build/plugin.bundle.js: stack traces' line
// numbers refer to it), then componentize-js builds that against ./wit
// (or $HERALD_WIT), world `plugin`.
import { componentize } from "@bytecodealliance/componentize-js";
import { build } from "esbuild";
import { existsSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const wit = resolve(process.env.HERALD_WIT || join(here, "wit"));
const out = join(here, "dist/plugin.wasm");
const bundle = join(here, ".build/plugin.bundle.js");
// TypeScript: esbuild strips the types (it does not check them: tsc --noEmit).
const entry = existsSync(join(here, "plugin.ts")) ? join(here, "plugin.ts") : join(here, "plugin.js");

for (const [path, what] of [[join(here, "herald-plugin.js"), "the SDK (sdk/js/herald-plugin.js)"], [wit, "the WIT folder (sdk/wit)"]]) {
  if (!existsSync(path)) {
    console.error(`build: ${path} is missing: copy ${what} beside plugin.js`);
    process.exit(1);
  }
}

const t0 = Date.now();
await build({
  entryPoints: [entry],
  outfile: bundle,
  bundle: true,
  format: "esm",
  platform: "neutral",
  target: "es2022",
  external: ["herald:*", "wasi:*"],
  logLevel: "warning",
});
const { component } = await componentize({
  sourcePath: bundle,
  witPath: wit,
  worldName: "plugin",
  // No fetch under Herald. console.log, crypto.getRandomValues and Date.now
  // still work (stdio, random, clocks).
  disableFeatures: ["http", "fetch-event"],
});
await mkdir(dirname(out), { recursive: true });
await writeFile(out, component);
console.log(`${out}: ${component.length} bytes in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

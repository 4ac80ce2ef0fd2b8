// Builds ticker.js into a herald:plugin@0.2.0 component (StarlingMonkey
// engine inside, about 12 MB) at ../target/js/ticker_js.wasm.
import { componentize } from '@bytecodealliance/componentize-js';
import { copyFile, mkdir, writeFile } from 'node:fs/promises';

// componentize-js reads the WIT from inside this directory.
await mkdir('.wit', { recursive: true });
await copyFile('../../sdk/wit/herald.wit', '.wit/herald.wit');
const { component } = await componentize({
  sourcePath: 'ticker.js',
  witPath: '.wit',
  worldName: 'plugin',
  // The plugin needs no clocks, randomness, stdio or HTTP: fewer imports.
  disableFeatures: ['stdio', 'random', 'clocks', 'http', 'fetch-event'],
});
await mkdir('../target/js', { recursive: true });
await writeFile('../target/js/ticker_js.wasm', component);
console.log(`plugins/target/js/ticker_js.wasm: ${component.length} bytes`);

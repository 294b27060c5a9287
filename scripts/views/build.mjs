// Builds the MCP Apps views (generated/views/<view>.html) from src/protocol/apps/: each view's
// script bundled with its bridge by esbuild, and the page, its style and script in one HTML
// file that loads nothing from anywhere. The protocol version the views speak is the pinned
// @modelcontextprotocol/ext-apps package's.
//   node scripts/views/build.mjs           writes generated/views/*.html
//   node scripts/views/build.mjs --check   fails when a committed view differs from its build
//   node scripts/views/build.mjs --host F  bundles the test host's page (tests/clients/apps/)
import { build } from 'esbuild';
import { readFile, writeFile, mkdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/ext-apps';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const sources = join(root, 'src', 'protocol', 'apps');
export const VIEWS = ['machines', 'egress', 'terminal'];

async function bundle(entry, options = {}) {
  const out = await build({
    entryPoints: [entry],
    bundle: true,
    minify: true,
    format: 'iife',
    target: 'es2020',
    platform: 'browser',
    write: false,
    legalComments: 'none',
    logLevel: 'error',
    ...options,
  });
  return out.outputFiles[0].text;
}

export async function view(name) {
  const script = await bundle(join(sources, `${name}.js`), {
    define: { PROTOCOL_VERSION: JSON.stringify(LATEST_PROTOCOL_VERSION) },
  });
  const style = (await readFile(join(sources, 'page.css'), 'utf8')).replace(/\s*\n\s*/g, ' ').trim();
  const page = await readFile(join(sources, 'page.html'), 'utf8');
  // A function as the replacement: a script may hold `$&` and the like.
  return page
    .replace('{{title}}', () => `smol-mcp ${name}`)
    .replace('{{style}}', () => style)
    // An inline script ends at the first "</script" whatever its quoting.
    .replace('{{script}}', () => script.replaceAll('</script', '<\\/script'));
}

const args = process.argv.slice(2);
if (args[0] === '--host') {
  const page = await bundle(join(root, 'tests', 'clients', 'apps', 'host.js'), { minify: false });
  await mkdir(dirname(args[1]), { recursive: true });
  await writeFile(args[1], page);
} else {
  const out = join(root, 'generated', 'views');
  const stale = [];
  for (const name of VIEWS) {
    const html = await view(name);
    const file = join(out, `${name}.html`);
    if (args[0] === '--check') {
      const committed = await readFile(file, 'utf8').catch(() => '');
      if (committed !== html) stale.push(`generated/views/${name}.html`);
    } else {
      await mkdir(out, { recursive: true });
      await writeFile(file, html);
      console.log(`generated/views/${name}.html: ${Buffer.byteLength(html)} bytes`);
    }
  }
  if (stale.length) {
    console.error(`${stale.join(', ')} differ from a build of src/protocol/apps/: run node scripts/views/build.mjs`);
    process.exit(1);
  }
}

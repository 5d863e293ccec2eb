// A user at a browser, for the authorization tests: Debian's chromium, headless, driven by
// playwright-core (tests/npm) through oidc-provider's devInteractions pages (see
// tests/servers/oidc_provider.mjs, `login: true`) until the browser has delivered the
// authorization response to the redirect URI (the client's loopback callback).
//
// Usage: node tests/servers/browser_login.mjs [--login NAME] [--cancel] URL
//
//   URL        the authorization request (the authorization server's /auth?...)
//   --login    the login typed into the login page (default "user"): the token's `sub`
//   --cancel   leave at the login page by its Cancel link, so the client gets
//              error=access_denied
//
// Made to be the BROWSER of Python's webbrowser (`BROWSER='node .../browser_login.mjs %s'`).
// It writes nothing on stdout, which it shares with the program that opened it (a gateway's
// stdout may be its MCP channel). Exits 0 once the redirect URI answered (whatever its
// status: judging the answer is the client's test); otherwise 1 with one line on stderr. The
// whole run is bounded by BOUND_MS.

import { chromium } from '../npm/node_modules/playwright-core/index.mjs';
import { ARGS, CHROMIUM } from './chromium.mjs';

const BOUND_MS = 20_000;

function fail(message) {
  process.stderr.write(`browser_login: ${message.split('\n')[0]}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const options = { login: 'user', cancel: false, url: undefined };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '--login' && i + 1 < argv.length) {
      options.login = argv[(i += 1)];
    } else if (argv[i] === '--cancel') {
      options.cancel = true;
    } else if (options.url === undefined && !argv[i].startsWith('--')) {
      options.url = argv[i];
    } else {
      fail(`unexpected argument ${argv[i]}`);
    }
  }
  if (options.url === undefined || URL.parse(options.url) === null) {
    fail('usage: browser_login.mjs [--login NAME] [--cancel] URL');
  }
  return options;
}

// The page's one line when it is neither a login nor a consent page (oidc-provider's error
// page says `error` and `error_description`).
async function describe(page) {
  const text = await page.locator('body').innerText({ timeout: 1000 }).catch(() => '');
  const line = text.split('\n').map((s) => s.trim()).filter(Boolean).join(' ').slice(0, 300);
  return `${page.url()}: ${line || '(empty page)'}`;
}

async function run({ url, login, cancel }) {
  const issuer = new URL(url).origin;
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ARGS,
    timeout: BOUND_MS,
  });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(BOUND_MS);
    // The end is the first top-level navigation that leaves the authorization server: the
    // redirect to the client's callback, answered or refused.
    const leaves = (request) => request.isNavigationRequest()
      && new URL(request.url()).origin !== issuer;
    let left = false;
    page.on('request', (request) => {
      left ||= leaves(request);
    });
    const delivered = new Promise((resolve, reject) => {
      page.on('requestfinished', (request) => {
        if (leaves(request)) {
          resolve(request.url());
        }
      });
      page.on('requestfailed', (request) => {
        if (leaves(request)) {
          reject(new Error(`${request.url()}: ${request.failure()?.errorText}`));
        }
      });
    });
    // The rejection is read below; until then it must not count as unhandled.
    delivered.catch(() => {});

    try {
      await page.goto(url, { waitUntil: 'domcontentloaded' });
    } catch (error) {
      // A redirect straight to a callback that refused is told by `delivered`; anything else
      // (the authorization server unreachable) ends here.
      if (!left) {
        throw error;
      }
    }
    // A login page, then a consent page; oidc-provider asks native clients for consent every
    // time, so two steps, and a third would be a loop.
    for (let step = 0; step < 3; step += 1) {
      if (new URL(page.url()).origin !== issuer) {
        break;
      }
      const prompt = await page.locator('form input[name="prompt"]').first()
        .getAttribute('value', { timeout: 2000 }).catch(() => null);
      const before = page.url();
      if (prompt === 'login' && cancel) {
        await page.locator('a', { hasText: 'Cancel' }).click();
      } else if (prompt === 'login') {
        await page.locator('input[name="login"]').fill(login);
        await page.locator('input[name="password"]').fill('any password');
        await page.locator('button[type="submit"]').click();
      } else if (prompt === 'consent') {
        await page.locator('button[type="submit"]').click();
      } else {
        throw new Error(`not a login or consent page: ${await describe(page)}`);
      }
      // Each step ends on a page at another URL: the next interaction or the callback (or
      // chromium's error page when the callback refused the connection; `delivered` says).
      await Promise.race([
        page.waitForURL((next) => next.href !== before, { waitUntil: 'domcontentloaded' }),
        delivered,
      ]);
    }
    return await delivered;
  } finally {
    await browser.close();
  }
}

const options = parseArgs(process.argv.slice(2));
const timer = setTimeout(() => fail(`no redirect within ${BOUND_MS / 1000} s`), BOUND_MS);
try {
  await run(options);
  clearTimeout(timer);
  process.exit(0);
} catch (error) {
  fail(error.message);
}

// The status page in a real browser, for tests/frontends/test_status_browser.py: Debian's chromium,
// headless, driven by playwright-core (tests/npm), with the flags of browser_login.mjs.
//
// Usage: node tests/servers/status_page.mjs URL [--expect NAME]... [--shows TEXT]
//                                               [--screenshot PATH]
//
//   URL           the admin listener's /status
//   --expect      a backend the page must show (a row and a chart each); the first one's
//                 request count is the one watched for a refresh
//   --shows       text the page must show as text (an error message with markup in it)
//   --screenshot  a PNG of the whole page, written once it has refreshed
//
// Talks with the test over stdin/stdout, one JSON object a line: once the page has rendered
// it writes {"rendered": ..., "requests": N} and waits for a line on stdin, {"at_least": M}
// (the test makes requests through the gateway meanwhile); then it waits until the page shows
// a count of at least M, without reloading, and writes the report ({"report": ...}: console errors, page errors,
// requests to other origins, ...) and exits 0. Any failure: 1 with one line on stderr. The
// whole run is bounded by BOUND_MS.

import { createInterface } from 'node:readline';
import { chromium } from '../npm/node_modules/playwright-core/index.mjs';
import { ARGS, CHROMIUM } from './chromium.mjs';

const BOUND_MS = 30_000;

function fail(message) {
  process.stderr.write(`status_page: ${String(message).split('\n')[0]}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const options = { url: undefined, expect: [], shows: [], screenshot: undefined };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '--expect' && i + 1 < argv.length) {
      options.expect.push(argv[(i += 1)]);
    } else if (argv[i] === '--shows' && i + 1 < argv.length) {
      options.shows.push(argv[(i += 1)]);
    } else if (argv[i] === '--screenshot' && i + 1 < argv.length) {
      options.screenshot = argv[(i += 1)];
    } else if (options.url === undefined && !argv[i].startsWith('--')) {
      options.url = argv[i];
    } else {
      fail(`unexpected argument ${argv[i]}`);
    }
  }
  if (options.url === undefined || URL.parse(options.url) === null || !options.expect.length) {
    fail('usage: status_page.mjs URL --expect NAME... [--shows TEXT] [--screenshot PATH]');
  }
  return options;
}

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

function say(object) {
  process.stdout.write(`${JSON.stringify(object)}\n`);
}

async function run({ url, expect, shows, screenshot }) {
  const origin = new URL(url).origin;
  const browser = await chromium.launch({
    executablePath: CHROMIUM, headless: true, args: ARGS, timeout: BOUND_MS,
  });
  try {
    // A fresh context: a profile of its own, nothing kept from any other run.
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await context.newPage();
    page.setDefaultTimeout(BOUND_MS);
    const consoleErrors = [];
    const pageErrors = [];
    const foreign = [];
    const failed = [];
    const fetched = [];
    page.on('console', (msg) => {
      if (msg.type() === 'error' || msg.type() === 'warning') consoleErrors.push(msg.text());
    });
    page.on('pageerror', (error) => pageErrors.push(error.message));
    page.on('request', (request) => {
      const where = new URL(request.url());
      if (where.origin !== origin) foreign.push(request.url());
      else fetched.push(where.pathname);
    });
    page.on('requestfailed', (request) => {
      failed.push(`${request.url()}: ${request.failure()?.errorText}`);
    });

    const response = await page.goto(url, { waitUntil: 'load' });
    const first = expect[0];
    const cell = page.locator(`#backends tr[data-backend="${first}"] td.requests`);
    await cell.waitFor();
    for (const name of expect) {
      await page.locator(`#backends tr[data-backend="${name}"]`).waitFor();
      await page.locator(`#charts .chart[data-backend="${name}"] svg`).waitFor();
    }
    for (const text of shows) {
      await page.getByText(text, { exact: false }).first().waitFor();
    }
    const before = await cell.innerText();
    say({ rendered: true, requests: Number(before) });

    const go = await lines.next();
    if (go.done) throw new Error('stdin ended before the go-ahead');
    const atLeast = JSON.parse(go.value).at_least;
    // The page refreshes by itself: no reload, the same document shows the new count.
    const loads = fetched.filter((p) => p === '/status').length;
    await page.waitForFunction(
      ([selector, least]) => Number(document.querySelector(selector)?.textContent) >= least,
      [`#backends tr[data-backend="${first}"] td.requests`, atLeast],
      { timeout: BOUND_MS },
    );
    const after = await cell.innerText();
    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
    say({
      report: {
        status: response.status(),
        csp: response.headers()['content-security-policy'] ?? null,
        requestsBefore: Number(before),
        requestsAfter: Number(after),
        reloads: fetched.filter((p) => p === '/status').length - loads,
        statusJsonFetches: fetched.filter((p) => p === '/status.json').length,
        consoleErrors,
        pageErrors,
        foreign,
        failed,
        pwned: await page.evaluate(() => window.__pwned ?? null),
        rows: await page.locator('#backends tr').count(),
        charts: await page.locator('#charts .chart svg').count(),
        refreshes: Number(await page.evaluate(() => document.body.dataset.refreshes)),
      },
    });
  } finally {
    await browser.close();
  }
}

const options = parseArgs(process.argv.slice(2));
const timer = setTimeout(() => fail(`not done within ${BOUND_MS / 1000} s`), BOUND_MS);
try {
  await run(options);
  clearTimeout(timer);
  process.exit(0);
} catch (error) {
  fail(error.message);
}

// The buyer's sale page in a real browser (Debian's Chromium, driven by playwright-core):
//
//   node scripts/browser/sale.mjs <gateway url> <product id> <token A> <token B> [screenshot dir]
//
// The product has one unit, a waiting room, and a sale that starts a few seconds from now.
// Buyer A opens the page before the start (countdown), joins the line, is admitted, buys,
// sees the order and pays it; buyer B joins behind A (waiting: one ahead) and is told the
// sale is sold out once A bought. Each state is awaited by the page's `data-state`, never
// by a fixed sleep. With SECKILL_SALE_POW=1 the gateway asks for a proof-of-work on joining:
// both buyers must have gone through the page's `proving` state (its Web Worker) to join. With a screenshot directory, each state is saved there as
// sale-<state>.png. Exits 0 when the whole flow was seen, 1 (with the reason) otherwise.
// gateway/tests/api/sale_page.rs runs it; scripts/tools.sh installs Chromium and this
// folder's node_modules.
import { mkdtempSync, rmSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const [gateway, productId, tokenA, tokenB, screenshots] = process.argv.slice(2);
if (!gateway || !productId || !tokenA || !tokenB) {
  console.error('usage: sale.mjs <gateway url> <product id> <token A> <token B> [screenshot dir]');
  process.exit(2);
}

// Generous: a loaded 2-core machine runs the whole platform beside this browser.
const STEP_MS = 60_000;
const CHROMIUM = process.env.SECKILL_CHROMIUM || '/usr/bin/chromium';
const POW = process.env.SECKILL_SALE_POW === '1';

const started = Date.now();
const log = (message) => console.log(`[sale.mjs +${((Date.now() - started) / 1000).toFixed(1)}s] ${message}`);

/** Waits until `page` shows one of `states` (comma-separated); on a timeout, says what it
 * showed instead. */
async function reach(page, who, states, timeout = STEP_MS) {
  const selector = states.split(',').map((state) => `body[data-state="${state.trim()}"]`).join(', ');
  try {
    await page.locator(selector).waitFor({ state: 'attached', timeout });
  } catch (e) {
    const shown = await page.evaluate(() => ({
      state: document.body.dataset.state,
      history: document.body.dataset.history,
      error: document.getElementById('error').hidden ? null : document.getElementById('error').textContent.trim(),
    })).catch(() => null);
    throw new Error(`${who}: no "${states}" within ${timeout} ms; the page shows ${JSON.stringify(shown)}`, { cause: e });
  }
  log(`${who}: ${await page.locator('body').getAttribute('data-state')}`);
}

async function shot(page, name) {
  if (!screenshots) return;
  await page.screenshot({ path: join(screenshots, `sale-${name}.png`), fullPage: true, animations: 'disabled', caret: 'hide' });
}

async function text(page, id) {
  return (await page.locator(`#${id}`).textContent()).trim();
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

const profile = mkdtempSync(join(tmpdir(), 'seckill-chromium-'));
let browser;
try {
  if (screenshots) mkdirSync(screenshots, { recursive: true });
  // A persistent context is the only way to give Chromium a user-data dir of our own: a
  // fresh one, so nothing of another run (or of a desktop profile) leaks in.
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 720, height: 820 },
    timeout: STEP_MS,
  });
  // Clicks and page loads too.
  browser.setDefaultTimeout(STEP_MS);
  log('chromium started');
  const url = `${gateway}/sale/${productId}`;

  // Buyer A: the countdown, then into the line before the start.
  const a = browser.pages()[0] || (await browser.newPage());
  a.on('pageerror', (e) => log(`A: page error: ${e.message}`));
  await a.goto(`${url}#token=${tokenA}`);
  await reach(a, 'A', 'countdown');
  check(!a.url().includes('token='), `the token stays in the address bar: ${a.url()}`);
  check(/\d+ s|min/.test(await text(a, 'countdown')), 'the countdown shows a time');
  await shot(a, 'countdown');
  // The countdown's button, or the open sale's should the start have come meanwhile.
  await a.locator('button.join:visible').click();
  // In line (admitted at once, should the start have come meanwhile).
  await reach(a, 'A', 'waiting, admitted');

  // Buyer B (its own session: another tab's sessionStorage): one place behind A. With one
  // unit on sale B is not admitted while A's pass may be used, so B waits until A bought.
  const b = await browser.newPage();
  b.on('pageerror', (e) => log(`B: page error: ${e.message}`));
  await b.goto(`${url}#token=${tokenB}`);
  await reach(b, 'B', 'countdown, ready');
  await b.locator('button.join:visible').click();
  await reach(b, 'B', 'waiting');
  check((await text(b, 'place')) === '#2', `B's place: ${await text(b, 'place')}`);
  check((await text(b, 'ahead')) === '1', `ahead of B: ${await text(b, 'ahead')}`);
  await shot(b, 'waiting');

  // A: admitted at the start, buys, pays.
  await reach(a, 'A', 'admitted');
  check(/\d+ s|min/.test(await text(a, 'pass-left')), "the pass's time left is shown");
  await shot(a, 'admitted');
  await a.locator('#buy').click();
  await reach(a, 'A', 'ordered');
  const orderId = await text(a, 'order-id');
  check(/^\d+$/.test(orderId), `an order id: ${orderId}`);
  await shot(a, 'ordered');
  await a.locator('#pay').click();
  await reach(a, 'A', 'paid');
  check((await text(a, 'paid-order-id')) === orderId, 'the paid order is the one bought');
  await shot(a, 'paid');
  const history = await a.locator('body').getAttribute('data-history');
  // `bought` lasts until the first result poll: seen here, in the page's own record.
  const proving = POW ? 'proving ' : '';
  check(
    new RegExp(`^loading countdown (ready )?${proving}(waiting )?admitted bought ordered paid$`).test(history),
    `A went through: ${history}`,
  );

  // B: the one unit is gone.
  await reach(b, 'B', 'sold_out');
  const historyB = await b.locator('body').getAttribute('data-history');
  check(!POW || historyB.includes(' proving waiting'), `B went through: ${historyB}`);
  await shot(b, 'sold-out');
  console.log(`ORDER ${orderId}`);
  log('done');
} catch (e) {
  console.error(`sale.mjs: ${e.message}`);
  process.exitCode = 1;
} finally {
  await browser?.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}

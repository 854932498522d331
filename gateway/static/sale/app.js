// The buyer's sale page (gateway/src/sale_page.rs, docs/waiting-room.md).
//
// One state at a time, named on <body> and <main> as `data-state` (the browser test waits on
// it); every state the page went through is kept, in order, in <body>'s `data-history`:
//
//   token      no token yet: a paste field
//   countdown  before the start (a waiting room may be joined already)
//   ready      the sale is on: join the line (or buy, when the sale has no waiting room)
//   proving    the gateway asks for a proof-of-work to join: solved in a Web Worker (pow.js)
//   waiting    in line: place, buyers ahead, estimated wait; polled at the server's pace
//   admitted   a pass to buy, and its time left
//   bought     the purchase accepted; its result polled until it is decided
//   ordered    the order, and a Pay button
//   paid       the order paid
//   failed, sold_out, closed, expired, unavailable   the ends, each with its message
//
// Errors are shown from the API's JSON `{code, message}`. The token comes from the URL
// fragment `#token=<jwt>` (kept in sessionStorage, removed from the address bar) or the
// paste field, and goes to the API as a bearer token.
'use strict';

(() => {
  const TOKEN_KEY = 'seckill.token';
  const productId = decodeURIComponent(location.pathname.split('/')[2] || '');
  const ticketKey = `seckill.ticket.${productId}`;
  const $ = (id) => document.getElementById(id);
  // The worker's script, beside this one and of the same version.
  const POW_URL = (document.currentScript?.src || `${location.origin}/sale/assets/app.js`).replace('/app.js', '/pow.js');
  // A join's refusals that carry a challenge to solve.
  const POW_CODES = ['proof_of_work_required', 'proof_of_work_expired', 'invalid_proof_of_work'];

  /** An answer of the API that was not a success. */
  class ApiError extends Error {
    constructor(status, code, message, retryAfterMs, body = null) {
      super(message);
      this.status = status;
      this.code = code;
      this.retryAfterMs = retryAfterMs;
      this.body = body;
    }
  }

  const page = {
    token: null,
    product: null,
    // 'fifo', 'open', or null while unknown (then joining tells).
    room: null,
    ticket: null,
    purchasePath: null,
    passExpiresAt: null,
    // The server's poll pacing: never poll faster than it last asked.
    pollAfterMs: 1000,
    orderId: null,
    // Server clock minus this one, from the responses' Date.
    clockOffsetMs: 0,
    idempotencyKey: randomKey(),
    timer: null,
    ticker: null,
    history: [],
  };

  function randomKey() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  }

  const now = () => Date.now() + page.clockOffsetMs;

  // --- state and rendering -------------------------------------------------------------

  function setState(state) {
    stopTimers();
    hideError();
    document.body.dataset.state = state;
    $('main').dataset.state = state;
    if (page.history[page.history.length - 1] !== state) {
      page.history.push(state);
      document.body.dataset.history = page.history.join(' ');
    }
    for (const section of document.querySelectorAll('section[data-for]')) {
      section.hidden = !section.dataset.for.split(' ').includes(state);
    }
  }

  const state = () => document.body.dataset.state;

  function showError(error) {
    const code = error instanceof ApiError ? error.code : 'error';
    $('error-code').textContent = code;
    $('error-message').textContent = error.message || String(error);
    $('error').dataset.code = code;
    $('error').hidden = false;
  }

  function hideError() {
    $('error').hidden = true;
    delete $('error').dataset.code;
  }

  /** Runs `fn` once in `ms` (one pending step at a time). */
  function later(ms, fn) {
    clearTimeout(page.timer);
    page.timer = setTimeout(fn, Math.max(0, ms));
  }

  /** Runs `fn` now and every quarter of a second (a clock on screen). */
  function tick(fn) {
    clearInterval(page.ticker);
    fn();
    page.ticker = setInterval(fn, 250);
  }

  function stopTimers() {
    clearTimeout(page.timer);
    clearInterval(page.ticker);
  }

  function duration(ms) {
    const seconds = Math.max(0, Math.ceil(ms / 1000));
    if (seconds < 60) return `${seconds} s`;
    const minutes = Math.floor(seconds / 60);
    if (minutes < 60) return `${minutes} min ${String(seconds % 60).padStart(2, '0')} s`;
    return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, '0')} min`;
  }

  const money = (cents) => (cents / 100).toFixed(2);

  const time = (ms) => new Date(ms).toLocaleTimeString();

  // --- the API ---------------------------------------------------------------------------

  async function api(method, path, headers = {}, json = undefined) {
    let response;
    try {
      const sent = json === undefined ? {} : { 'content-type': 'application/json' };
      response = await fetch(path, {
        method,
        cache: 'no-store',
        headers: { accept: 'application/json', authorization: `Bearer ${page.token}`, ...sent, ...headers },
        body: json === undefined ? undefined : JSON.stringify(json),
      });
    } catch (e) {
      throw new ApiError(0, 'network_error', `The platform could not be reached (${e.message}).`, 2000);
    }
    const date = Date.parse(response.headers.get('date') || '');
    if (!Number.isNaN(date)) {
      // The header has whole seconds (its middle is the best guess): only a clock clearly
      // off is corrected.
      const offset = date + 500 - Date.now();
      page.clockOffsetMs = Math.abs(offset) > 1500 ? offset : 0;
    }
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    if (!response.ok) {
      const retry = Number(response.headers.get('retry-after'));
      throw new ApiError(
        response.status,
        (body && body.code) || `http_${response.status}`,
        (body && body.message) || response.statusText || 'request failed',
        Number.isFinite(retry) && retry > 0 ? retry * 1000 : null,
        body,
      );
    }
    return body;
  }

  /** Whether `error` means the token is not (or no longer) good: then ask for another. */
  function tokenRefused(error) {
    if (error instanceof ApiError && error.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      page.token = null;
      setState('token');
      showError(error);
      return true;
    }
    return false;
  }

  /** A passing trouble (overload, rate limit, network): retried after what the server says. */
  function transient(error) {
    return error instanceof ApiError && [0, 429, 502, 503, 504].includes(error.status);
  }

  // --- the flow --------------------------------------------------------------------------

  function takeToken() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    const given = fragment.get('token');
    if (given) {
      sessionStorage.setItem(TOKEN_KEY, given.trim());
      history.replaceState(null, '', location.pathname + location.search);
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  async function start() {
    page.token = takeToken();
    if (!page.token) {
      setState('token');
      return;
    }
    setState('loading');
    try {
      page.product = await api('GET', `/api/products/${encodeURIComponent(productId)}`);
    } catch (e) {
      if (tokenRefused(e)) return;
      if (transient(e)) {
        showError(e);
        later(e.retryAfterMs || 2000, start);
        return;
      }
      setState('unavailable');
      showError(e);
      return;
    }
    renderProduct();
    if (['fifo', 'raffle', 'open'].includes(page.product.waiting_room)) {
      page.room = page.product.waiting_room;
    }
    // Back on the page after a purchase: pick up where it stands.
    try {
      const result = await api('GET', `/api/seckill/${productId}/result`);
      if (result.status !== 'none') {
        onResult(result);
        return;
      }
    } catch (e) {
      if (tokenRefused(e)) return;
    }
    page.ticket = sessionStorage.getItem(ticketKey);
    if (page.ticket) {
      poll();
      return;
    }
    beforeJoining();
  }

  function renderProduct() {
    const p = page.product;
    $('product-name').textContent = p.name;
    const start = Date.parse(p.start_at);
    const end = Date.parse(p.end_at);
    $('product-facts').textContent =
      `${money(p.price_cents)} · ${p.stock_total} ${p.stock_total === 1 ? 'unit' : 'units'} · ${new Date(start).toLocaleString()} – ${time(end)}`;
    document.title = `${p.name} — flash sale`;
  }

  /** Countdown, open, or over, by the clock. */
  function beforeJoining() {
    const start = Date.parse(page.product.start_at);
    const end = Date.parse(page.product.end_at);
    if (now() >= end) {
      setState('closed');
      return;
    }
    if (now() < start) {
      setState('countdown');
      const open = page.room === 'open';
      $('join-early').hidden = open;
      $('countdown-note').textContent = open
        ? 'This sale has no line: buy as soon as it opens.'
        : 'Join the line now to keep your place: buyers are let in in the order they arrived.';
      tick(() => {
        const left = start - now();
        $('countdown').textContent = duration(left);
        if (left <= 0) beforeJoining();
      });
      return;
    }
    setState('ready');
    const open = page.room === 'open';
    $('join').textContent = open ? 'Buy now' : 'Join the line';
    $('ready-note').textContent = open
      ? 'No line for this sale: the first to buy get the units.'
      : 'Join the line: buyers are let in in the order they arrive.';
  }

  /** Solves the challenge of a join's refusal in a Web Worker, showing its progress;
   * resolves to the join's body. */
  function prove(refusal) {
    setState('proving');
    $('proving-progress').textContent = '';
    return new Promise((resolve, reject) => {
      const worker = new Worker(POW_URL);
      const fail = (message) => {
        worker.terminate();
        reject(new ApiError(0, 'proof_of_work_failed', `The puzzle could not be solved here (${message}).`));
      };
      worker.onmessage = (event) => {
        const m = event.data || {};
        if (typeof m.nonce === 'string') {
          worker.terminate();
          resolve({ challenge: refusal.challenge, nonce: m.nonce });
        } else if (m.progress) {
          const share = Math.min(99, Math.floor((100 * m.progress) / m.expected));
          $('proving-progress').textContent = `About ${share} % of the expected work done.`;
        } else if (m.error) {
          fail(m.error);
        }
      };
      worker.onerror = (event) => fail(event.message || 'the worker stopped');
      worker.postMessage({ challenge: refusal.challenge, bits: refusal.bits });
    });
  }

  async function join(button, proof = undefined, proofs = 0) {
    if (page.room === 'open') {
      buy(button);
      return;
    }
    button.disabled = true;
    try {
      const answer = await api('POST', `/api/rooms/${productId}/join`, {}, proof);
      page.ticket = answer.ticket;
      sessionStorage.setItem(ticketKey, page.ticket);
      onRoomAnswer(answer);
    } catch (e) {
      if (tokenRefused(e)) return;
      if (POW_CODES.includes(e.code) && e.body && typeof e.body.challenge === 'string' && proofs < 3) {
        // The gateway asks for a proof-of-work (its challenge comes with the refusal).
        let solution;
        try {
          solution = await prove(e.body);
        } catch (failed) {
          beforeJoining();
          showError(failed);
          return;
        }
        join(button, solution, proofs + 1);
        return;
      }
      if (e.code === 'no_waiting_room') {
        // An open sale: bought directly.
        page.room = 'open';
        if (now() >= Date.parse(page.product.start_at)) {
          buy(button);
        } else {
          beforeJoining();
        }
        return;
      }
      if (e.code === 'closed') {
        setState('closed');
        return;
      }
      // Back to the join button, should a proof have gone before.
      if (state() === 'proving') beforeJoining();
      showError(e);
    } finally {
      button.disabled = false;
    }
  }

  async function poll() {
    try {
      onRoomAnswer(await api('GET', `/api/rooms/${productId}/tickets/${encodeURIComponent(page.ticket)}`));
    } catch (e) {
      if (tokenRefused(e)) return;
      if (e.code === 'invalid_ticket' || e.code === 'no_waiting_room') {
        // Not this sale's ticket (another sale, another user): start over.
        sessionStorage.removeItem(ticketKey);
        page.ticket = null;
        beforeJoining();
        showError(e);
        return;
      }
      showError(e);
      later(Math.max(page.pollAfterMs, e.retryAfterMs || 2000), poll);
    }
  }

  function onRoomAnswer(answer) {
    page.pollAfterMs = Math.max(answer.poll_after_ms || 0, 250);
    switch (answer.state) {
      case 'waiting': {
        setState('waiting');
        // A raffle's place is the draw's rank once drawn; before the draw nobody's is known.
        const drawn = answer.rank !== undefined && answer.rank !== null;
        const position = drawn ? answer.rank : answer.place;
        $('place').textContent = drawn ? `#${position + 1} in the draw` : `#${position + 1}`;
        $('ahead').textContent = answer.ahead === null ? 'drawn at the start' : String(answer.ahead);
        $('wait').textContent = answer.wait_ms > 0 ? `about ${duration(answer.wait_ms)}` : 'any moment';
        const startsIn = answer.starts_at_ms - now();
        const raffle = answer.ahead === null
          ? 'You are in the draw: the order of the line is drawn when the sale starts. '
          : '';
        $('waiting-note').textContent = startsIn > 0
          ? `${raffle}The sale starts in ${duration(startsIn)}. Keep this page open: it updates by itself.`
          : `${raffle}Keep this page open: it updates by itself.`;
        later(page.pollAfterMs, poll);
        break;
      }
      case 'admitted':
        page.purchasePath = answer.purchase_path;
        page.passExpiresAt = answer.pass_expires_at_ms;
        setState('admitted');
        tick(() => {
          const left = page.passExpiresAt - now();
          $('pass-left').textContent = duration(left);
          // Run out: the server says so.
          if (left <= 0) {
            stopTimers();
            poll();
          }
        });
        break;
      case 'sold_out':
        setState('sold_out');
        $('sold-out-note').textContent = 'You keep your place: should a unit come back, this page lets you know.';
        later(page.pollAfterMs, poll);
        break;
      case 'expired':
        setState('expired');
        break;
      case 'closed':
        setState('closed');
        break;
      default:
        showError(new ApiError(200, 'unexpected_state', `unexpected state ${answer.state}`));
        later(page.pollAfterMs, poll);
    }
  }

  async function buy(button) {
    const path = page.room === 'open' || !page.purchasePath ? `/api/seckill/${productId}` : page.purchasePath;
    button.disabled = true;
    try {
      await api('POST', path, { 'idempotency-key': page.idempotencyKey });
      bought();
    } catch (e) {
      if (tokenRefused(e)) return;
      switch (e.code) {
        case 'already_purchased':
          bought();
          return;
        case 'sold_out':
          setState('sold_out');
          $('sold-out-note').textContent = '';
          if (page.ticket) later(page.pollAfterMs, poll);
          return;
        case 'pass_expired':
          setState('expired');
          return;
        case 'admission_required':
          // The sale has a waiting room after all.
          page.room = 'fifo';
          join(button);
          return;
        default:
          showError(e);
      }
    } finally {
      button.disabled = false;
    }
  }

  function bought() {
    sessionStorage.removeItem(ticketKey);
    setState('bought');
    $('bought-status').textContent = 'Queued.';
    later(500, result);
  }

  async function result() {
    try {
      onResult(await api('GET', `/api/seckill/${productId}/result`));
    } catch (e) {
      if (tokenRefused(e)) return;
      showError(e);
      later(e.retryAfterMs || 2000, result);
    }
  }

  function onResult(answer) {
    switch (answer.status) {
      case 'success':
        page.orderId = answer.order_id;
        loadOrder();
        break;
      case 'failed':
        setState('failed');
        $('failed-reason').textContent = `Reason: ${answer.reason || 'unknown'}.`;
        break;
      default:
        // queued (or not visible yet): asked again in a second.
        if (state() !== 'bought') setState('bought');
        $('bought-status').textContent = `Status: ${answer.status}.`;
        later(1000, result);
    }
  }

  async function loadOrder() {
    try {
      onOrder(await api('GET', `/api/orders/${page.orderId}`));
    } catch (e) {
      if (tokenRefused(e)) return;
      showError(e);
      later(e.retryAfterMs || 2000, loadOrder);
    }
  }

  function onOrder(order) {
    if (order.status === 'paid') {
      setState('paid');
      $('paid-order-id').textContent = String(order.id);
      $('paid-at').textContent = order.paid_at ? ` (${time(Date.parse(order.paid_at))})` : '';
      return;
    }
    if (order.status === 'cancelled') {
      setState('failed');
      $('failed-reason').textContent = `Order ${order.id} was cancelled: ${order.cancel_reason || 'no reason given'}.`;
      return;
    }
    setState('ordered');
    $('order-id').textContent = String(order.id);
    $('order-amount').textContent = money(order.price_cents);
    $('order-pay-by').textContent = order.pay_by ? time(Date.parse(order.pay_by)) : '—';
  }

  async function pay(button) {
    button.disabled = true;
    try {
      onOrder(await api('POST', `/api/orders/${page.orderId}/pay`));
    } catch (e) {
      if (tokenRefused(e)) return;
      showError(e);
    } finally {
      button.disabled = false;
    }
  }

  // --- wiring ------------------------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    $('token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const token = $('token-input').value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      $('token-input').value = '';
      start();
    });
    $('join-early').addEventListener('click', (event) => join(event.currentTarget));
    $('join').addEventListener('click', (event) => join(event.currentTarget));
    $('buy').addEventListener('click', (event) => buy(event.currentTarget));
    $('pay').addEventListener('click', (event) => pay(event.currentTarget));
    start();
  });
})();

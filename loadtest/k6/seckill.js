// k6 flash-sale burst: USERS distinct buyers, each buying PRODUCT_ID exactly once.
//
// Usage (the product must exist and be on sale, e.g. created by `seckill-loadtest` or the
// admin API):
//   k6 run -e GATEWAY_URL=http://127.0.0.1:8080 -e PRODUCT_ID=7 -e USERS=5000 \
//          -e JWT_SECRET=seckill-dev-jwt-secret-change-me [-e VUS=256] [-e FIRST_USER_ID=1] \
//          [-e P99_MS=1000] [-e SUMMARY_JSON=/tmp/k6-summary.json] loadtest/k6/seckill.js
// Then check the invariants with `seckill-loadtest --product-id 7 ...` or
// `GET /admin/products/7/stock`. Each buyer's HS256 token is minted in the script, so no
// token file is needed.
//
// Buyers FIRST_USER_ID .. FIRST_USER_ID + USERS - 1 each send one purchase: the
// shared-iterations executor runs USERS iterations in all, and iteration n (unique across
// VUs) is buyer FIRST_USER_ID + n; an iteration cut off by maxDuration is never retried.
// Thresholds (k6 exits 99 when one fails): every answer is 202, 409 or 410 (no 5xx, 429 or
// transport error), and the purchases' p99 latency stays under P99_MS. The end-of-test
// summary is the script's own (handleSummary): answers by status, purchases/s, latency and
// each threshold on stdout, and with SUMMARY_JSON that summary as JSON (key `seckill`) next to
// k6's full data (key `k6`).

import http from 'k6/http';
import { check } from 'k6';
import crypto from 'k6/crypto';
import encoding from 'k6/encoding';
import exec from 'k6/execution';
import { Counter } from 'k6/metrics';

const GATEWAY_URL = (__ENV.GATEWAY_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
const PRODUCT_ID = __ENV.PRODUCT_ID;
const USERS = parseInt(__ENV.USERS || '5000', 10);
const JWT_SECRET = __ENV.JWT_SECRET || 'seckill-dev-jwt-secret-change-me';
const FIRST_USER_ID = parseInt(__ENV.FIRST_USER_ID || '1', 10);
const VUS = Math.min(parseInt(__ENV.VUS || '256', 10), USERS);
const P99_MS = parseFloat(__ENV.P99_MS || '1000');
const SUMMARY_JSON = __ENV.SUMMARY_JSON || '';

if (!PRODUCT_ID) {
  throw new Error('set PRODUCT_ID (-e PRODUCT_ID=<id>)');
}

// One counter per answer, so the end-of-test summary shows how the stock was shared out.
const answers = {
  202: new Counter('seckill_accepted'),
  409: new Counter('seckill_already_purchased'),
  410: new Counter('seckill_sold_out'),
};
const otherAnswers = new Counter('seckill_other_status');
const sent = new Counter('seckill_purchases_sent');

export const options = {
  scenarios: {
    burst: {
      // shared-iterations: USERS iterations in total across all VUs, each one a new buyer.
      executor: 'shared-iterations',
      vus: VUS,
      iterations: USERS,
      maxDuration: '10m',
    },
  },
  thresholds: {
    // Every buyer must get a definite answer: queued, already bought or sold out.
    checks: ['rate==1.0'],
    // Failed = any answer but 202/409/410 (responseCallback below), transport errors included.
    http_req_failed: ['rate==0'],
    seckill_other_status: ['count==0'],
    // The purchases only (tagged kind=purchase), not whatever else a run may request.
    'http_req_duration{kind:purchase}': [`p(99)<${P99_MS}`],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)'],
};

// base64url without padding, as JWT wants it.
function b64url(text) {
  return encoding.b64encode(text, 'rawurl');
}

// An HS256 JWT for `userId`, valid for an hour.
function mintToken(userId) {
  const now = Math.floor(Date.now() / 1000);
  const header = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const claims = b64url(JSON.stringify({ sub: String(userId), iat: now, exp: now + 3600 }));
  const signature = crypto.hmac('sha256', JWT_SECRET, `${header}.${claims}`, 'base64rawurl');
  return `${header}.${claims}.${signature}`;
}

export default function () {
  // iterationInTest is unique across all VUs of the scenario: one distinct buyer each.
  const userId = FIRST_USER_ID + exec.scenario.iterationInTest;
  sent.add(1);
  const response = http.post(`${GATEWAY_URL}/api/seckill/${PRODUCT_ID}`, null, {
    headers: { Authorization: `Bearer ${mintToken(userId)}` },
    tags: { name: 'POST /api/seckill/{product_id}', kind: 'purchase' },
    responseCallback: http.expectedStatuses(202, 409, 410),
  });
  (answers[response.status] || otherAnswers).add(1);
  check(response, {
    'status is 202, 409 or 410': (r) => [202, 409, 410].includes(r.status),
  });
}

function count(data, name) {
  const metric = data.metrics[name];
  return metric ? metric.values.count : 0;
}

// Every threshold with whether it held, as `metric: expression`.
function thresholds(data) {
  const out = [];
  for (const [name, metric] of Object.entries(data.metrics)) {
    for (const [expression, result] of Object.entries(metric.thresholds || {})) {
      out.push({ metric: name, expression, ok: result.ok });
    }
  }
  return out.sort((a, b) => `${a.metric}${a.expression}`.localeCompare(`${b.metric}${b.expression}`));
}

export function handleSummary(data) {
  const duration = data.metrics['http_req_duration{kind:purchase}'];
  const latency = duration ? duration.values : {};
  const seconds = data.state.testRunDurationMs / 1000;
  const statuses = {
    202: count(data, 'seckill_accepted'),
    409: count(data, 'seckill_already_purchased'),
    410: count(data, 'seckill_sold_out'),
    other: count(data, 'seckill_other_status'),
  };
  const answered = statuses[202] + statuses[409] + statuses[410] + statuses.other;
  const checked = thresholds(data);
  const summary = {
    buyers: USERS,
    first_user_id: FIRST_USER_ID,
    product_id: Number(PRODUCT_ID),
    vus: VUS,
    sent: count(data, 'seckill_purchases_sent'),
    answered,
    statuses,
    seconds,
    // Over k6's run, which ends with the last iteration: the purchases are all it does.
    purchases_per_sec: seconds > 0 ? answered / seconds : 0,
    latency_ms: {
      p50: latency.med,
      p90: latency['p(90)'],
      p95: latency['p(95)'],
      p99: latency['p(99)'],
      max: latency.max,
    },
    thresholds: checked,
    thresholds_ok: checked.every((t) => t.ok),
  };
  const ms = (v) => (v === undefined ? 'n/a' : v.toFixed(2));
  const lines = [
    '',
    'seckill purchases',
    `  buyers           ${summary.buyers} (users ${FIRST_USER_ID}..${FIRST_USER_ID + USERS - 1}), ${VUS} VUs`,
    `  sent             ${summary.sent}`,
    `  answered         ${answered} (202 ${statuses[202]}, 409 ${statuses[409]}, 410 ${statuses[410]}, other ${statuses.other})`,
    `  purchases/s      ${summary.purchases_per_sec.toFixed(1)} (over ${seconds.toFixed(3)} s)`,
    `  latency ms       p50 ${ms(latency.med)}  p90 ${ms(latency['p(90)'])}  p99 ${ms(latency['p(99)'])}  max ${ms(latency.max)}`,
    '  thresholds',
    ...checked.map((t) => `    ${t.ok ? 'ok  ' : 'FAIL'} ${t.metric}: ${t.expression}`),
    `SECKILL_K6_REPORT ${JSON.stringify(summary)}`,
    '',
  ];
  const out = { stdout: lines.join('\n') };
  if (SUMMARY_JSON) {
    out[SUMMARY_JSON] = JSON.stringify({ seckill: summary, k6: data }, null, 2);
  }
  return out;
}

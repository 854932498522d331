// k6 flash-sale burst: USERS distinct buyers, each buying PRODUCT_ID exactly once.
//
// Usage (the product must exist and be on sale, e.g. created by `seckill-loadtest` or the
// admin API):
//   k6 run -e GATEWAY_URL=http://127.0.0.1:8080 -e PRODUCT_ID=7 -e USERS=5000 \
//          -e JWT_SECRET=seckill-dev-jwt-secret-change-me [-e VUS=256] [-e FIRST_USER_ID=1] \
//          loadtest/k6/seckill.js
// Then check the invariants with `seckill-loadtest --product-id 7 ...` or
// `GET /admin/products/7/stock`. Each buyer's HS256 token is minted in the script, so no
// token file is needed.

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
  },
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
  const response = http.post(`${GATEWAY_URL}/api/seckill/${PRODUCT_ID}`, null, {
    headers: { Authorization: `Bearer ${mintToken(userId)}` },
    tags: { name: 'POST /api/seckill/{product_id}' },
    responseCallback: http.expectedStatuses(202, 409, 410),
  });
  (answers[response.status] || otherAnswers).add(1);
  check(response, {
    'status is 202, 409 or 410': (r) => [202, 409, 410].includes(r.status),
  });
}

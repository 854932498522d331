// The buyer's page's proof-of-work solver (gateway/src/room/pow.rs, docs/waiting-room.md),
// run as a Web Worker so that the page stays responsive while it works.
//
// Given {challenge, bits}, it finds the first nonce n from 0 such that
// SHA-256(challenge ":" n), n in decimal, starts with `bits` zero bits; it posts
// {progress, expected} every 2^16 tries and {nonce, tried} when found.
//
// SHA-256 (FIPS 180-4) is written out here: a synchronous hash of a few dozen bytes is what
// is needed, many times over, where crypto.subtle would cost a promise per hash. Its
// constants are computed, as the standard defines them, from the first 64 primes.
'use strict';

const PRIMES = [];
for (let candidate = 2; PRIMES.length < 64; candidate++) {
  if (PRIMES.every((p) => candidate % p !== 0)) PRIMES.push(candidate);
}
// The first 32 bits of the fractional part.
const fraction = (x) => ((x - Math.floor(x)) * 0x100000000) >>> 0;
const K = Int32Array.from(PRIMES, (p) => fraction(Math.cbrt(p)) | 0);
const INITIAL = Int32Array.from(PRIMES.slice(0, 8), (p) => fraction(Math.sqrt(p)) | 0);

const W = new Int32Array(64);
const STATE = new Int32Array(8);

const rotr = (x, n) => (x >>> n) | (x << (32 - n));

/** SHA-256 of `bytes[0..length]` into STATE; `bytes` must have room for the padding (up to
 * the next multiple of 64 past length + 8) and is padded in place. */
function sha256(bytes, length) {
  const blocks = ((length + 8) >> 6) + 1;
  const end = blocks * 64;
  bytes.fill(0, length, end);
  bytes[length] = 0x80;
  const bitLength = length * 8;
  bytes[end - 4] = bitLength >>> 24;
  bytes[end - 3] = bitLength >>> 16;
  bytes[end - 2] = bitLength >>> 8;
  bytes[end - 1] = bitLength;
  STATE.set(INITIAL);
  for (let block = 0; block < blocks; block++) {
    const at = block * 64;
    for (let i = 0; i < 16; i++) {
      const j = at + i * 4;
      W[i] = (bytes[j] << 24) | (bytes[j + 1] << 16) | (bytes[j + 2] << 8) | bytes[j + 3];
    }
    for (let i = 16; i < 64; i++) {
      const a = W[i - 15];
      const b = W[i - 2];
      const s0 = rotr(a, 7) ^ rotr(a, 18) ^ (a >>> 3);
      const s1 = rotr(b, 17) ^ rotr(b, 19) ^ (b >>> 10);
      W[i] = (W[i - 16] + s0 + W[i - 7] + s1) | 0;
    }
    let a = STATE[0];
    let b = STATE[1];
    let c = STATE[2];
    let d = STATE[3];
    let e = STATE[4];
    let f = STATE[5];
    let g = STATE[6];
    let h = STATE[7];
    for (let i = 0; i < 64; i++) {
      const t1 = (h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + W[i]) | 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g;
      g = f;
      f = e;
      e = (d + t1) | 0;
      d = c;
      c = b;
      b = a;
      a = (t1 + t2) | 0;
    }
    STATE[0] += a;
    STATE[1] += b;
    STATE[2] += c;
    STATE[3] += d;
    STATE[4] += e;
    STATE[5] += f;
    STATE[6] += g;
    STATE[7] += h;
  }
}

/** Leading zero bits of STATE. */
function leadingZeros() {
  let bits = 0;
  for (let i = 0; i < 8; i++) {
    const zeros = Math.clz32(STATE[i]);
    bits += zeros;
    if (zeros < 32) break;
  }
  return bits;
}

/** The first nonce that solves `challenge` at `bits`, as its decimal text. */
function solve(challenge, bits, progress) {
  const prefix = `${challenge}:`;
  // The prefix, up to 16 digits of nonce, and the padding.
  const bytes = new Uint8Array((((prefix.length + 16 + 8) >> 6) + 1) * 64);
  for (let i = 0; i < prefix.length; i++) bytes[i] = prefix.charCodeAt(i) & 0xff;
  for (let nonce = 0; ; nonce++) {
    const digits = String(nonce);
    for (let i = 0; i < digits.length; i++) bytes[prefix.length + i] = digits.charCodeAt(i);
    sha256(bytes, prefix.length + digits.length);
    if (leadingZeros() >= bits) return { nonce: digits, tried: nonce + 1 };
    if ((nonce & 0xffff) === 0xffff) progress(nonce + 1);
  }
}

/** The hex digest of an ASCII `text` (the self-check below, and tests). */
function hex(text) {
  const bytes = new Uint8Array((((text.length + 8) >> 6) + 1) * 64);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i) & 0xff;
  sha256(bytes, text.length);
  return Array.from(STATE, (word) => (word >>> 0).toString(16).padStart(8, '0')).join('');
}

// FIPS 180-4's example: a hash that is not SHA-256 must never send the page into an endless
// search.
const WORKING = hex('abc') === 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad';

if (typeof self !== 'undefined' && typeof self.postMessage === 'function') {
  self.onmessage = (event) => {
    const { challenge, bits } = event.data || {};
    if (!WORKING || typeof challenge !== 'string' || !Number.isInteger(bits) || bits < 0 || bits > 64) {
      self.postMessage({ error: WORKING ? 'not a challenge' : 'SHA-256 does not compute here' });
      return;
    }
    const expected = 2 ** bits;
    self.postMessage(solve(challenge, bits, (tried) => self.postMessage({ progress: tried, expected })));
  };
}

if (typeof module !== 'undefined') module.exports = { hex, solve };

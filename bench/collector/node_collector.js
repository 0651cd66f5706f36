// bench/collector/node_collector.js -- the Node.js peer of the collector benchmark: a plain
// `http` server that does what esx.collector does for a POST of JSON events, the simple way:
// reads the body (64 KiB limit), JSON.parse (one event, an array, or NDJSON), validates each
// event with esx's schema (site_id / type required, [A-Za-z0-9_.-], lengths; block_id, variant,
// user_id, event_id, ts checked when present; no top-level "_" names), stamps received_at and an
// event_id, buffers the bulk lines in memory (bounded: 503 beyond 64 MiB, 503 over 50 requests
// in progress) and ships them to Elasticsearch with _bulk (create, _id = event_id, gzip level 1
// for bodies >= 16 KiB like the esx client in the bench) every 1000 ms or 5000 events / 1 MiB,
// two bulks in flight, retrying failed items.  Answers 204.  Unlike esx it keeps no rollups
// (per-window counts and HyperLogLog of user_ids) and does not check duplicate or empty member
// names: it does a little less work per event than esx.
//
//   node node_collector.js PORT ES_URL [QUEUE_MAX_BYTES]
//   GET /stats -> {"accepted":n,"shipped":n,"queued":n,"in_flight":n,"rejected":n}
'use strict';
const http = require('http');
const zlib = require('zlib');
const crypto = require('crypto');

const port = Number(process.argv[2] || 8090);
const es = new URL(process.argv[3] || 'http://127.0.0.1:9200');
const MAX_BODY = 65536, MAX_EVENTS = 100, MAX_CONCURRENT = 50, QUEUE_MAX = Number(process.argv[4] || 64 * 1048576);
const BATCH_BYTES = 1048576, BATCH_EVENTS = 5000, FLUSH_MS = 1000, BULK_CONCURRENCY = 2;

const NAME = /^[A-Za-z0-9_.-]+$/, EID = /^[A-Za-z0-9_.:-]+$/;
const agent = new http.Agent({ keepAlive: true, maxSockets: BULK_CONCURRENCY });

let queue = [], queueBytes = 0, inFlight = 0, inProgress = 0, oldest = 0;
const st = { accepted: 0, shipped: 0, rejected: 0, retried: 0, bulk_requests: 0, bulk_failures: 0 };

function name(v, max) { return typeof v === 'string' && v.length >= 1 && v.length <= max && NAME.test(v); }
function validate(ev) {
  if (ev === null || typeof ev !== 'object' || Array.isArray(ev)) return 'event is not an object';
  if (!name(ev.site_id, 64)) return 'site_id';
  if (!name(ev.type, 32)) return 'type';
  if (ev.block_id !== undefined && !name(ev.block_id, 64)) return 'block_id';
  if (ev.variant !== undefined && !name(ev.variant, 64)) return 'variant';
  if (ev.user_id !== undefined && !(typeof ev.user_id === 'string' ? ev.user_id.length >= 1 &&
      Buffer.byteLength(ev.user_id) <= 128 : Number.isInteger(ev.user_id))) return 'user_id';
  if (ev.event_id !== undefined && !(typeof ev.event_id === 'string' && ev.event_id.length >= 1 &&
      ev.event_id.length <= 64 && EID.test(ev.event_id))) return 'event_id';
  if (ev.ts !== undefined && typeof ev.ts !== 'number') return 'ts';
  for (const k in ev) if (k.charCodeAt(0) === 95) return 'metadata field';
  return null;
}
function parse(text) {
  const t = text.trim();
  if (t[0] === '[') return JSON.parse(t);
  if (t.indexOf('\n') < 0) return [JSON.parse(t)];
  return t.split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l));
}
function pad(n) { return n < 10 ? '0' + n : '' + n; }
function index(ms) { const d = new Date(ms); return `events-${d.getUTCFullYear()}.${pad(d.getUTCMonth() + 1)}.${pad(d.getUTCDate())}`; }

function answer(res, status, body, headers) {
  res.writeHead(status, Object.assign({ 'Cache-Control': 'no-store' }, headers || {},
    body ? { 'Content-Type': 'application/json' } : {}));
  res.end(body || undefined);
}

function collect(req, res) {
  if (inProgress >= MAX_CONCURRENT) { st.rejected++; return answer(res, 503, '{"error":"overloaded"}', { 'Retry-After': '1' }); }
  inProgress++;
  const chunks = []; let size = 0, done = false;
  const finish = () => { if (!done) { done = true; inProgress--; } };
  req.on('data', (c) => {
    size += c.length;
    if (size > MAX_BODY && !done) { finish(); st.rejected++; answer(res, 413, '{"error":"body too large"}'); req.destroy(); }
    else chunks.push(c);
  });
  req.on('error', finish);
  req.on('end', () => {
    if (done) return;
    finish();
    let events;
    try { events = parse(Buffer.concat(chunks).toString('utf8')); } catch (e) { st.rejected++; return answer(res, 400, '{"error":"not JSON"}'); }
    if (!Array.isArray(events) || events.length === 0) { st.rejected++; return answer(res, 400, '{"error":"no event"}'); }
    if (events.length > MAX_EVENTS) { st.rejected++; return answer(res, 413, '{"error":"too many events"}'); }
    const now = Date.now(), lines = [], rejected = [];
    let bytes = 0;
    events.forEach((ev, i) => {
      const err = validate(ev);
      if (err) { rejected.push({ index: i, error: err }); return; }
      ev.received_at = now;
      if (ev.event_id === undefined) ev.event_id = crypto.randomBytes(15).toString('base64url');
      const line = `{"create":{"_index":"${index(now)}","_id":"${ev.event_id}"}}\n${JSON.stringify(ev)}\n`;
      lines.push(line); bytes += line.length + 64;
    });
    if (lines.length === 0) { st.rejected++; return answer(res, 400, JSON.stringify({ error: 'no valid event', rejected })); }
    if (queueBytes + bytes > QUEUE_MAX) { st.rejected++; return answer(res, 503, '{"error":"queue full"}', { 'Retry-After': '1' }); }
    if (queue.length === 0) oldest = now;
    for (const l of lines) queue.push(l);
    queueBytes += bytes; st.accepted += lines.length;
    if (queue.length >= BATCH_EVENTS) ship();
    if (rejected.length) return answer(res, 200, JSON.stringify({ accepted: lines.length, rejected }));
    answer(res, 204);
  });
}

function ship() {
  while (inFlight < BULK_CONCURRENCY && queue.length > 0) {
    const batch = []; let bytes = 0;
    while (queue.length > 0 && batch.length < BATCH_EVENTS && bytes + queue[0].length <= BATCH_BYTES) {
      const l = queue.shift(); batch.push(l); bytes += l.length;
    }
    if (batch.length === 0) batch.push(queue.shift());
    if (queue.length > 0) oldest = Date.now();
    send(batch);
  }
}

function send(batch) {
  inFlight++;
  const body = Buffer.from(batch.join(''));
  const post = (payload, gz) => {
    const req = http.request({ host: es.hostname, port: es.port, path: '/_bulk?filter_path=errors,items.*.status,items.*.error', method: 'POST', agent,
      headers: Object.assign({ 'Content-Type': 'application/x-ndjson', 'Content-Length': payload.length },
        gz ? { 'Content-Encoding': 'gzip' } : {}) }, (res) => {
      const parts = [];
      res.on('data', (c) => parts.push(c));
      res.on('end', () => {
        inFlight--; st.bulk_requests++;
        let failed = [];
        if (res.statusCode !== 200) { st.bulk_failures++; failed = batch; }
        else {
          try {
            const r = JSON.parse(Buffer.concat(parts).toString('utf8'));
            if (r.errors) r.items.forEach((it, i) => {
              const s = (it.create || it.index).status;
              if (s === 429 || s >= 500) failed.push(batch[i]);   // 409 = already there
            });
          } catch (e) { st.bulk_failures++; failed = batch; }
        }
        done(batch, failed);
      });
    });
    req.on('error', () => { inFlight--; st.bulk_failures++; done(batch, batch); });
    req.end(payload);
  };
  if (body.length >= 16384) zlib.gzip(body, { level: 1 }, (e, gz) => post(gz, true));
  else post(body, false);
}

function done(batch, failed) {
  const ok = batch.length - failed.length;
  st.shipped += ok;
  for (const l of batch) queueBytes -= l.length + 64;
  if (failed.length) {   // still held (and counted) until acknowledged; sent again after 100 ms
    st.retried += failed.length;
    for (const l of failed) queueBytes += l.length + 64;
    setTimeout(() => { for (const l of failed) queue.push(l); ship(); }, 100);
  }
  if (queue.length >= BATCH_EVENTS) ship();
}

setInterval(() => { if (queue.length > 0 && Date.now() - oldest >= FLUSH_MS) ship(); }, 50);

http.createServer((req, res) => {
  if (req.url === '/stats') {
    return answer(res, 200, JSON.stringify(Object.assign({ queued: queue.length, in_flight: inFlight }, st)));
  }
  if (req.method === 'POST') return collect(req, res);
  res.writeHead(405, { Allow: 'POST' }); res.end();
}).listen(port, '127.0.0.1', () => console.log(`node collector on ${port}`));

// bench/client/node_search.js -- the official Elasticsearch Node.js client as the peer.
//
//   node bench/client/node_search.js URL CONCURRENCY SECONDS [WARMUP_SECONDS]
//
// Prints one line: "searches=N seconds=S rate=R errors=E cpu=C [server_cpu=V]" (C: CPU seconds
// of the process, all threads, during the measured S seconds; V: CPU seconds of the server
// process BENCH_SERVER_PID, e.g. the nginx worker, during the same S seconds, so that the
// warm-up's searches are not charged to the measured ones).  One process, CONCURRENCY async
// loops each awaiting client.search() (concurrency 1 = one loop), the same query as
// search.lua; the client stringifies the query and parses the response on every call.
'use strict'
const fs = require('fs')
const { Client } = require('@elastic/elasticsearch')

const [url, concArg, secondsArg, warmupArg] = process.argv.slice(2)
const conc = Number(concArg)
const seconds = Number(secondsArg)
const warmup = Number(warmupArg ?? '1')
if (!url || !conc || !seconds) {
  console.error('usage: node_search.js URL CONCURRENCY SECONDS [WARMUP]')
  process.exit(2)
}

const client = new Client({ node: url, compression: false, maxRetries: 0 })
const request = {
  index: 'goods',
  query: {
    bool: {
      must: [{ multi_match: { query: 'オーバーサイズ パーカー', fields: ['name^2', 'brand.name'] } }],
      filter: [{ term: { gender: 'men' } }, { range: { price: { lte: 20000 } } }]
    }
  },
  _source: ['goods_id', 'name', 'brand.name', 'price', 'sale_price', 'image'],
  size: 10
}

// CPU seconds (user + system, all threads) the server process BENCH_SERVER_PID has used so far,
// from /proc/PID/stat (BENCH_SERVER_HZ: clock ticks per second); null without BENCH_SERVER_PID.
const serverPid = process.env.BENCH_SERVER_PID
const serverHz = Number(process.env.BENCH_SERVER_HZ || '100')
function serverCpu () {
  if (!serverPid) return null
  let stat
  try { stat = fs.readFileSync(`/proc/${serverPid}/stat`, 'utf8') } catch (e) { return null }
  // after the command name (in parentheses, may hold spaces): state is field 3, so utime and
  // stime (fields 14 and 15) are the 12th and 13th words
  const w = stat.slice(stat.lastIndexOf(') ') + 2).trim().split(/\s+/)
  const u = Number(w[11]); const s = Number(w[12])
  return Number.isFinite(u) && Number.isFinite(s) ? (u + s) / serverHz : null
}

async function loop (deadline, counts) {
  while (performance.now() < deadline) {
    try {
      const res = await client.search(request)
      if (res.hits.hits.length === 10) counts.n++
      else counts.errors++
    } catch (err) {
      counts.errors++
      if (counts.errors === 1) console.error(err)
    }
  }
}

async function run (ms) {
  const counts = { n: 0, errors: 0 }
  const deadline = performance.now() + ms
  const loops = []
  for (let i = 0; i < conc; i++) loops.push(loop(deadline, counts))
  await Promise.all(loops)
  return counts
}

async function main () {
  if (warmup > 0) await run(warmup * 1000)
  const srv0 = serverCpu()
  const t0 = performance.now()
  const cpu0 = process.cpuUsage()
  const { n, errors } = await run(seconds * 1000)
  const dt = (performance.now() - t0) / 1000
  const used = process.cpuUsage(cpu0)
  const cpu = (used.user + used.system) / 1e6
  const srv1 = serverCpu()
  const srv = srv0 !== null && srv1 !== null ? ` server_cpu=${(srv1 - srv0).toFixed(3)}` : ''
  console.log(`searches=${n} seconds=${dt.toFixed(3)} rate=${(n / dt).toFixed(1)} errors=${errors} cpu=${cpu.toFixed(3)}${srv}`)
  await client.close()
}

main().catch((err) => { console.error(err); process.exit(1) })

// What the Node.js peer scripts share: the command line, the payload and the job record.
// Mirrors bench/peer_cli.py so that every system carries the same job and is checked the same way.
'use strict'

const fs = require('fs')

function parseArgs (argv) {
  const args = {
    mode: argv[0],
    dsn: null,
    rows: 0,
    idsFile: null,
    batchSize: 0,
    concurrency: 0,
    perCall: 1
  }
  for (let i = 1; i < argv.length; i += 2) {
    const key = argv[i]
    const value = argv[i + 1]
    if (key === '--dsn') args.dsn = value
    else if (key === '--rows') args.rows = Number(value)
    else if (key === '--ids-file') args.idsFile = value
    else if (key === '--batch-size') args.batchSize = Number(value)
    else if (key === '--concurrency') args.concurrency = Number(value)
    else if (key === '--per-call') args.perCall = Number(value)
    else throw new Error(`unknown option ${key}`)
  }
  if (!['seed', 'work', 'enqueue'].includes(args.mode) || !args.dsn) {
    throw new Error('usage: seed|work|enqueue --dsn URL [--rows N] [--ids-file PATH] [--per-call N]')
  }
  return args
}

function payload (number) {
  return {
    i: number,
    recipient: `user${number}@example.com`,
    template: 'otp',
    data: { name: `User ${number}` }
  }
}

// The producer benchmark's job, as bench/enqueue_peers.py's job_payload builds it for PgQueuer.
function jobPayload (number) {
  return {
    kind: 'otp',
    recipient: `user${number}@example.com`,
    aggregate_id: `user-${number}`,
    template: 'otp',
    data: { name: `User ${number}`, minutes_valid: 10 },
    code: String(Math.abs(number) % 1000000).padStart(6, '0')
  }
}

// A fresh key per message, the same one leasebox's receipt and PgQueuer's dedupe_key get.
function dedupeKey (number) {
  return `otp-request-${number}`
}

// The messages sent before the clock starts, numbered below every timed one, as
// bench/enqueue_rate.py warms leasebox: 50 single sends, or 5 calls of a batch.
function warmBatches (perCall) {
  const batches = []
  if (perCall === 1) {
    for (let i = -1000050; i < -1000000; i++) batches.push([i])
    return batches
  }
  for (let first = -1000000 - 5 * perCall; first < -1000000; first += perCall) {
    batches.push(range(first, first + perCall))
  }
  return batches
}

function timedBatches (count, perCall) {
  const batches = []
  for (let first = 0; first < count; first += perCall) {
    batches.push(range(first, Math.min(first + perCall, count)))
  }
  return batches
}

function range (start, stop) {
  return Array.from({ length: stop - start }, (_, k) => start + k)
}

function writeIds (path, seen) {
  if (path) fs.writeFileSync(path, JSON.stringify(seen))
}

function main (run) {
  run(parseArgs(process.argv.slice(2))).then(
    () => process.exit(0),
    (err) => {
      console.error(err && err.stack ? err.stack : String(err))
      process.exit(1)
    }
  )
}

const SEED_CHUNK = 10000

module.exports = {
  main,
  payload,
  jobPayload,
  dedupeKey,
  warmBatches,
  timedBatches,
  writeIds,
  SEED_CHUNK
}

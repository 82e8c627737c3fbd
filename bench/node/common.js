// What the Node.js peer scripts share: the command line, the payload and the job record.
// Mirrors bench/peer_cli.py so that every system carries the same job and is checked the same way.
'use strict'

const fs = require('fs')

function parseArgs (argv) {
  const args = { mode: argv[0], dsn: null, rows: 0, idsFile: null, batchSize: 0, concurrency: 0 }
  for (let i = 1; i < argv.length; i += 2) {
    const key = argv[i]
    const value = argv[i + 1]
    if (key === '--dsn') args.dsn = value
    else if (key === '--rows') args.rows = Number(value)
    else if (key === '--ids-file') args.idsFile = value
    else if (key === '--batch-size') args.batchSize = Number(value)
    else if (key === '--concurrency') args.concurrency = Number(value)
    else throw new Error(`unknown option ${key}`)
  }
  if (!['seed', 'work'].includes(args.mode) || !args.dsn) {
    throw new Error('usage: seed|work --dsn URL [--rows N] [--ids-file PATH]')
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

module.exports = { main, payload, writeIds, SEED_CHUNK }

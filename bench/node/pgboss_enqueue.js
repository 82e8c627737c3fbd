// pg-boss 10 as a producer, through its own public API: send(name, data, { singletonKey })
// one job per call (each its own transaction), or insert([...]) for a batch in one call, each
// job with its singletonKey (insert takes it per job). The queue's policy is 'short', the
// one under which a singletonKey dedupes a job still queued (with pg-boss's default
// 'standard' policy the key is stored and dedupes nothing; the unique index job_i1 that
// 'short' uses is what the key costs).
//
// `enqueue --dsn URL --rows N --per-call K` installs pg-boss's schema into a fresh database,
// creates the queue, analyses, sends the warm-up jobs, then prints the seconds the N timed
// jobs took as JSON on stdout. Start-up, installing and the warm-up are not timed.
'use strict'

const PgBoss = require('pg-boss')
const { main, jobPayload, dedupeKey, warmBatches, timedBatches } = require('./common')

const QUEUE = 'otp'
const POLICY = 'short'

async function send (boss, numbers, perCall) {
  if (perCall === 1) {
    const id = await boss.send(QUEUE, jobPayload(numbers[0]), { singletonKey: dedupeKey(numbers[0]) })
    if (id === null) throw new Error(`send of ${numbers[0]} was deduplicated`)
    return
  }
  await boss.insert(
    numbers.map((i) => ({ name: QUEUE, data: jobPayload(i), singletonKey: dedupeKey(i) }))
  )
}

async function enqueue (args) {
  const boss = new PgBoss({
    connectionString: args.dsn,
    max: 2,
    supervise: false,
    schedule: false,
    migrate: true
  })
  boss.on('error', (err) => console.error(err.message))
  await boss.start()
  try {
    await boss.createQueue(QUEUE, { policy: POLICY })
    await boss.getDb().executeSql('ANALYZE')
    for (const numbers of warmBatches(args.perCall)) await send(boss, numbers, args.perCall)
    const batches = timedBatches(args.rows, args.perCall)
    const start = process.hrtime.bigint()
    for (const numbers of batches) await send(boss, numbers, args.perCall)
    const seconds = Number(process.hrtime.bigint() - start) / 1e9
    process.stdout.write(JSON.stringify({ seconds, policy: POLICY }) + '\n')
  } finally {
    await boss.stop({ graceful: false, wait: true, close: true })
  }
}

main(enqueue)

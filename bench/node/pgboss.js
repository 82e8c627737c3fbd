// pg-boss 10 as a drain peer, with its fastest documented settings for short jobs:
// batchSize 1000 per fetch, the shortest polling interval it accepts (0.5 s), and sixteen
// work() subscriptions per process (each work() call adds a polling worker; 16 was the fastest
// of 1 to 32 on the benchmark machine), with a pool to match. pg-boss has no
// drain mode, so the process stops once its queue has nothing created, retrying or active
// left (checked every 50 ms; the same wait is in the empty-queue run that is subtracted).
// Completed jobs stay in pgboss.job with state 'completed', which the harness counts.
'use strict'

const PgBoss = require('pg-boss')
const { main, payload, writeIds, SEED_CHUNK } = require('./common')

const QUEUE = 'otp'
const SETTINGS = { batchSize: 1000, pollingIntervalSeconds: 0.5, subscriptions: 16 }

function makeBoss (dsn, work, subscriptions) {
  // Maintenance and cron are switched off in workers: they do no job processing.
  return new PgBoss({
    connectionString: dsn,
    max: work ? subscriptions + 2 : 2,
    supervise: !work,
    schedule: false,
    migrate: !work
  })
}

async function seed (args) {
  const boss = makeBoss(args.dsn, false, 0)
  boss.on('error', (err) => console.error(err.message))
  await boss.start()
  await boss.createQueue(QUEUE)
  for (let start = 0; start < args.rows; start += SEED_CHUNK) {
    const jobs = []
    for (let i = start; i < Math.min(start + SEED_CHUNK, args.rows); i++) {
      jobs.push({ name: QUEUE, data: payload(i) })
    }
    await boss.insert(jobs)
  }
  await boss.stop({ graceful: false, wait: true, close: true })
}

async function work (args) {
  const seen = []
  let inflight = 0
  const subscriptions = args.concurrency || SETTINGS.subscriptions
  const boss = makeBoss(args.dsn, true, subscriptions)
  boss.on('error', (err) => console.error(err.message))
  await boss.start()
  const options = {
    batchSize: args.batchSize || SETTINGS.batchSize,
    pollingIntervalSeconds: SETTINGS.pollingIntervalSeconds
  }
  for (let k = 0; k < subscriptions; k++) {
    await boss.work(QUEUE, options, async (jobs) => {
      inflight++
      try {
        for (const job of jobs) seen.push(job.data.i)
      } finally {
        inflight--
      }
    })
  }
  const db = boss.getDb()
  const active = `SELECT count(*)::int AS n FROM pgboss.job WHERE name = $1 AND state = 'active'`
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    if (inflight > 0) continue
    if ((await boss.getQueueSize(QUEUE)) > 0) continue
    const { rows } = await db.executeSql(active, [QUEUE])
    if (rows[0].n === 0 && inflight === 0) break
  }
  await boss.stop({ graceful: true, wait: true, close: true, timeout: 5000 })
  writeIds(args.idsFile, seen)
}

main((args) => (args.mode === 'seed' ? seed(args) : work(args)))

// graphile-worker 0.16 as a drain peer, with its fastest documented settings for short jobs:
// concurrentJobs 24 and maxPoolSize 25 (the configuration of its performance page; 0.16
// has no local queue or batched completion yet), runOnce so the process exits when no job
// is left, and a logger that drops the per-job info lines. Jobs are deleted on success, so
// every handler records its payload number, and the harness checks the table is empty.
'use strict'

const { Pool } = require('pg')
const { Logger, runMigrations, runOnce } = require('graphile-worker')
const { main, writeIds, SEED_CHUNK } = require('./common')

const SETTINGS = { concurrentJobs: 24, maxPoolSize: 25, pollInterval: 2000 }

const quietLogger = new Logger(() => (level, message) => {
  if (level === 'error' || level === 'warning') console.error(message)
})

const SEED_SQL = `
SELECT count(*)::int AS n FROM graphile_worker.add_jobs(ARRAY(
  SELECT ROW('otp', json_build_object(
      'i', g, 'recipient', 'user' || g || '@example.com', 'template', 'otp',
      'data', json_build_object('name', 'User ' || g)),
    NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
  FROM generate_series($1::int, $2::int) AS g))`

async function seed (args) {
  await runMigrations({ connectionString: args.dsn, logger: quietLogger })
  const pool = new Pool({ connectionString: args.dsn, max: 1 })
  try {
    for (let start = 0; start < args.rows; start += SEED_CHUNK) {
      const end = Math.min(start + SEED_CHUNK, args.rows) - 1
      await pool.query(SEED_SQL, [start, end])
    }
  } finally {
    await pool.end()
  }
}

async function work (args) {
  const seen = []
  await runOnce({
    connectionString: args.dsn,
    concurrency: args.concurrency || SETTINGS.concurrentJobs,
    maxPoolSize: SETTINGS.maxPoolSize,
    pollInterval: SETTINGS.pollInterval,
    noHandleSignals: true,
    logger: quietLogger,
    taskList: {
      otp: async (payload) => {
        seen.push(payload.i)
      }
    }
  })
  writeIds(args.idsFile, seen)
}

main((args) => (args.mode === 'seed' ? seed(args) : work(args)))

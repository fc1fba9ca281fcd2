package cli

// The Examples sections of the commands' help (cobra's Example). Every line
// that starts with "lockd " is parsed against the command's flags by
// TestHelpExamplesParse, so an example cannot name a flag that is gone.

const exampleRun = `  # one nightly backup at a time; exit 0 quietly if the last one still runs (cron)
  lockd run --wait 0 --conflict-exit-code 0 --max-runtime 2h jobs/backup -- /usr/local/bin/backup

  # at most 4 exports at once (a counting semaphore; every run on the key uses --limit 4)
  lockd run --limit 4 exports -- ./export.sh

  # readers together, a writer alone (a waiting writer keeps later readers out)
  lockd run --shared catalog -- ./read-catalog.sh
  lockd run --exclusive catalog -- ./rebuild-catalog.sh

  # a resource that cannot check LOCKD_FENCING_TOKEN: nobody else for 30s after an
  # involuntary end, and the server revokes the lock after 1h even if this run is wedged
  lockd run --lock-delay 30s --max-hold 1h --owner web-3/migrate db/migrate -- ./migrate.sh`

const exampleElect = `  # run the scheduler only on the leader; lockd leader shows where it serves
  lockd elect --value http://web-3:8080 --owner web-3 election/scheduler -- ./scheduler`

const exampleLeader = `  lockd leader election/scheduler
  lockd leader --watch -o json election/scheduler`

const exampleSessions = `  lockd sessions
  lockd sessions -o json --principal ci-runner`

const exampleInspect = `  lockd inspect jobs/backup
  lockd inspect -o json exports`

const exampleLs = `  lockd ls
  lockd ls -o json jobs/`

const exampleWatch = `  lockd watch jobs/
  lockd watch -o json`

package runner

// Suite returns every scenario of issue 6, controls included, in the order
// the table lists them. The etcd scenarios that need to reach etcd from
// outside lockd (a proxy in between, two replicas sharing it, a cluster)
// run a separate etcd process; the others use lockd's embedded etcd.
func Suite() []Spec {
	return []Spec{
		{Name: "pause-embedded", Backend: Embedded, Fault: PauseHolder},
		{Name: "pause-pg", Backend: PG, Fault: PauseHolder},
		{Name: "kill-holder-embedded", Backend: Embedded, Fault: KillHolder},
		{Name: "kill-holder-pg", Backend: PG, Fault: KillHolder},
		{Name: "kill-lockd-embedded", Backend: Embedded, Fault: KillLockd},
		{Name: "kill-lockd-pg", Backend: PG, Fault: KillLockd},
		{Name: "partition-short-etcd", Backend: Etcd, Fault: PartitionShort},
		{Name: "partition-short-pg", Backend: PG, Fault: PartitionShort},
		{Name: "partition-long-etcd", Backend: Etcd, Fault: PartitionLong, Cycles: 1},
		{Name: "partition-long-pg", Backend: PG, Fault: PartitionLong, Cycles: 1},
		{Name: "partition-replica-etcd", Backend: Etcd, Fault: PartitionReplica},
		{Name: "partition-replica-pg", Backend: PG, Fault: PartitionReplica},
		{Name: "pg-restart-fast", Backend: PG, Fault: PGRestartFast},
		{Name: "pg-restart-immediate", Backend: PG, Fault: PGRestartImmediate},
		{Name: "clock-skew-embedded", Backend: Embedded, Fault: ClockSkew},
		{Name: "clock-skew-pg", Backend: PG, Fault: ClockSkew},
		{Name: "replica-death-etcd", Backend: Etcd, Fault: ReplicaDeath},
		{Name: "replica-death-pg", Backend: PG, Fault: ReplicaDeath},
		{Name: "replica-switch-etcd", Backend: Etcd, Fault: ReplicaSwitch},
		{Name: "replica-switch-pg", Backend: PG, Fault: ReplicaSwitch},
		{Name: "leader-kill-etcd3", Backend: EtcdCluster, Fault: LeaderKill},
		{Name: "far-holder-pg", Backend: PG, Fault: FarHolder},
		// issue 11 §8: quorum loss, an isolated old leader, a paused
		// replica, restarts on an empty or an older data directory.
		{Name: "quorum-loss-etcd3", Backend: EtcdCluster, Fault: QuorumLoss, Cycles: 1},
		{Name: "leader-isolated-etcd3", Backend: EtcdCluster, Fault: LeaderIsolate, Cycles: 1},
		{Name: "lockd-pause-etcd", Backend: Etcd, Fault: LockdPause},
		{Name: "lockd-pause-pg", Backend: PG, Fault: LockdPause},
		{Name: "restart-empty-embedded", Backend: Embedded, Fault: RestartEmpty, Cycles: 1},
		{Name: "restart-older-embedded", Backend: Embedded, Fault: RestartOlder},
		// issue 15: semaphore and read/write workers under pauses and
		// kills (multi.go); in short mode pauses of both kinds on etcd,
		// pauses and kills of both on PostgreSQL.
		{Name: "multi-embedded", Backend: Embedded, Fault: MultiPauseKill},
		{Name: "multi-pg", Backend: PG, Fault: MultiPauseKill, Cycles: 4},
		// issue 13: three replicas over one backend; every session
		// survives the replica it talks to (replicaTTL).
		{Name: "replica-kill-etcd", Backend: Etcd, Fault: ReplicaKill, Cycles: 3, TTL: replicaTTL},
		{Name: "replica-kill-pg", Backend: PG, Fault: ReplicaKill, Cycles: 3, TTL: replicaTTL},
		{Name: "rolling-restart-etcd", Backend: Etcd, Fault: RollingRestart, Cycles: 1, TTL: replicaTTL},
		{Name: "rolling-restart-pg", Backend: PG, Fault: RollingRestart, Cycles: 1, TTL: replicaTTL},
		// issue 21 §2: every member of a 3-member etcd replaced in turn
		// (remove, then add a fresh one) under load; lockd must follow.
		{Name: "member-replace-etcd3", Backend: EtcdCluster, Fault: MemberReplace, Cycles: 3},
		{Name: "control-fencing-off-embedded", Backend: Embedded, Fault: PauseHolder, Control: FencingOff},
		{Name: "control-fencing-off-pg", Backend: PG, Fault: PauseHolder, Control: FencingOff},
		{Name: "control-receive-ttl-embedded", Backend: Embedded, Fault: UpstreamHold, Control: ReceiveTTL, TTL: upstreamTTL},
		{Name: "control-receive-ttl-pg", Backend: PG, Fault: UpstreamHold, Control: ReceiveTTL, TTL: upstreamTTL},
		{Name: "control-slow-clock-embedded", Backend: Embedded, Fault: PauseHolder, Control: SlowClock},
		{Name: "control-recvtime-sdk-pg", Backend: PG, Fault: FarHolder, Control: RecvTimeSDK},
		{Name: "control-stale-record-etcd", Backend: Etcd, Fault: ReplicaKill, Control: StaleRecord, TTL: replicaTTL},
		{Name: "control-no-heal-pg", Backend: PG, Fault: PartitionShort, Control: NoHeal},
		{Name: "control-sem-extra-embedded", Backend: Embedded, Fault: MultiPauseKill, Control: SemExtra},
		{Name: "control-ignore-done-pg", Backend: PG, Fault: MultiPauseKill, Control: IgnoreDone},
		{Name: "control-no-sync-etcd3", Backend: EtcdCluster, Fault: MemberReplace, Control: NoSync, Cycles: etcdClusterSize},
	}
}

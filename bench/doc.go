// Package bench measures crisp against Debian's containerd on the same machine: it
// starts each runtime with its own root, state, socket, bridge and subnet, drives both
// through the same CRI client code, and reports each figure with the crisp/containerd
// ratio. `make bench` runs it (bench_test.go, build tag "bench"); nothing here runs in
// `make test` except the unit tests of the pure parts.
//
// Each runtime goes through these parts in turn, all with the same requests:
//
//   - base (-base, on by default): image pulls, -cycles sequential pod cycles, a
//     -churn of 10 concurrent clients, the memory of 20 pods, ExecSync latency, and
//     lists at 100 pods.
//   - density (-density N, 30 by default, 0 for none): N pods of one busybox `sleep`,
//     started by 10 clients each making RunPodSandbox, CreateContainer and
//     StartContainer as kubelet's pod workers do. It reports the time until all N run
//     and each pod's start p50/p99; the PSS and USS of everything the runtime runs
//     (daemon, every shim, every pause process, summed) and per pod (shim+pause); the
//     CPU (utime+stime from /proc/PID/stat) those processes use together over an
//     -idle window (60 s by default) with nothing asked of them, as CPU-ms per 60 s;
//     ListPodSandbox, ListContainers, ListContainerStats and ListPodSandboxStats
//     p50/p99 over -list-calls calls each (after 5 untimed), with one container a pod
//     and again with three (a second `sleep` and an exited `true`); and the time 10
//     clients take to stop and remove all N (StopContainer for each container,
//     StopPodSandbox, RemovePodSandbox).
//   - soak (-soak, off by default): -soak-execs ExecSync `true` into one container,
//     the shim's PSS after the first, the 100th and the last (a Go shim's heap grows
//     over its first ~100 execs, so growth from the 100th is what work leaves
//     behind); then -soak-cycles pod cycles from 10 clients, the daemon's RSS after
//     -soak-first and after all. Every reading follows a 2 s settle, since crisp's
//     shim returns freed memory a second after work. The growth rows the issue sets a
//     target for have an absolute bound (≤ 5 %) rather than a ratio.
//   - NRI cost (-nri, on by default: ~25 s; -only nri runs it alone): three crisps
//     alive at once, identical but for NRI: disabled, enabled with no plugin, and
//     enabled with one no-op plugin (NoopPlugin, built with NRI's pkg/stub, run in
//     the bench process and connected to that crisp's own NRI socket under the
//     bench's dir, never /var/run/nri) that subscribes to every event, including
//     ValidateContainerAdjustment, and answers each without an adjustment. Each gets
//     its own dir, socket, bridge, cgroup parent and a /18 of the crisp run's /16
//     subnet (torn down by then). After 3 warm-up cycles each, -cycles pod cycles run
//     on each, round by round, the order rotating each round, so the machine's drift
//     and other work weigh on all three alike (three daemons rather than one
//     restarted per config: a restart puts minutes between the variants' cycles).
//     It reports pod cycle p50/p99 and pod start p50 of each, their difference from
//     the disabled crisp's with its 95 % bootstrap interval (1000 resamplings of the
//     rounds, a round's cycles kept together; a fixed seed), and the noise: the
//     disabled crisp's same figures between its even and its odd rounds. At 50
//     cycles p99 is the slowest cycle and its noise is large; use -cycles 200 for a
//     p99 worth reading. The run fails if the plugin answered
//     fewer than 9 events a timed cycle (it answers 10).
//
// The pod start breakdown is crisp's alone: criserver serves its Prometheus metrics
// on a loopback port in every run (-crisp-metrics, on by default, since serving them
// was measured to cost nothing measurable; -crisp-metrics=false measures crisp
// without), and after the sequential cycles the bench scrapes them and reports the
// mean (sum/count) of each phase of crisp_pod_start_phase_duration_seconds and
// crisp_container_create_phase_duration_seconds. With -base=false it runs -cycles
// sequential cycles for that alone.
//
// Quick runs: BENCHFLAGS='-only crisp -base=false -density 10 -idle 5s -list-calls 20 -nri=false';
// the NRI cost alone: BENCHFLAGS='-only nri'.
//
// Runs of one -instance (0 by default) wait for each other (a lock next to their
// root): they share the root, the bridges, the subnets and the cgroup parents, and
// each removes what it finds there. Runs of different instances may run at once, for
// when several people share a machine; their figures then disturb each other.
package bench

// Package bench measures crisp against Debian's containerd (and, for pulls,
// containerd 2.x) on the same machine: it starts each runtime with its own root,
// state, socket, bridge and subnet, drives both through the same CRI client code,
// and reports each figure with the crisp/containerd ratio. `make bench` runs it (bench_test.go, build tag "bench"); nothing here runs in
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
//   - tracing cost (-tracing, on by default: ~50 s at 50 cycles; -only tracing runs it
//     alone): crisps alive at once, built like the NRI comparison's (own dir, socket,
//     bridge, cgroup parent, a /18 of the crisp run's /16): base, the binaries in
//     -base-bin, built before tracing existed (commit fb5f5ee; skipped, with a log
//     line, without the flag); off, today's binaries with tracing off (the default);
//     on, today's with [tracing] enabled, every call of a sampled trace exported over
//     OTLP/gRPC to a receiver in the bench process (otlptest). Every call of a cycle
//     carries a new sampled W3C traceparent in its gRPC metadata, as kubelet with
//     tracing sends it, on every variant (the same requests everywhere; only on makes
//     spans of them). -cycles rounds as NRI's; Δ of off against base (the cost of
//     tracing's code while off) and of on against off, each with its 95 % bootstrap
//     interval, and the noise of each reference between its even and odd rounds. The
//     receiver must hold every traced cycle's trace with a server span for each of
//     its 6 CRI calls and at least one shim span, or the run fails; the spans a cycle
//     are reported. Then, one variant at a time, 10 pods with a `sleep` and 3
//     ExecSyncs each, all traced: each shim's PSS and USS (Δ with a bootstrap interval
//     over the shims), and criserver's RSS and RssAnon after the warm-up and after
//     the timed cycles.
//   - WebAssembly pods (-wasm, on by default: ~80 s at 40 cycles; -only wasm runs it
//     alone): one crisp with two runtime handlers, runc (shim-runc) and wasm
//     (shim-wasm), its own dir, socket, bridge, cgroup parent and the last /18 of the
//     crisp run's /16. The module is the e2e tests' test/e2e/testdata/wasm/hello,
//     built once a run with the go command for wasip1 (skipped, with a log line, when
//     it cannot build for wasip1 or the source is not found) and pushed as an OCI
//     image whose entrypoint is /hello.wasm. 3 warm-up cycles each (the first wasm
//     one compiles the module into crisp's compilation cache: the first cycle of each
//     handler is reported as the cold start), then -cycles rounds of one pod cycle on
//     each, the order alternating: runc a busybox `sleep 3600`, wasm the module with
//     sleep=forever, each RunPodSandbox, CreateContainer, StartContainer (pod start),
//     StopContainer with no grace, StopPodSandbox, RemovePodSandbox. shim-wasm's
//     StartContainer returns before the module is loaded, so the wasm cycle also waits
//     for the container's first output in its CRI log (running: pod start and that
//     wait; the wait is in no cycle phase). Pod start p50/p99, running p50 and pod
//     cycle p50 of each, wasm's Δ against runc with its 95 % bootstrap interval, the
//     noise of each between its even and odd rounds. Then, one handler at a time, 10
//     pods running at once, and per pod the PSS/USS of its shim, its pause process
//     and its container's process (runc: the `sleep`; wasm: the `shim-wasm _run`
//     child, Go runtime, wazero and the module), their sum, wasm's Δ with a bootstrap
//     interval over the pods, and the container's USS by kind of mapping (anonymous
//     executable: wazero's compiled code; other anonymous; file-backed).
//   - pull (in every run at a small size; -pull for the full one; -only pull for it
//     alone): images the benchmark generates (NewPullTree, seeded, 4-25 s at full
//     size, so not cached): 6 layers, ~25,000 small text-like files (locales, Perl
//     libraries, a Go tree, docs) and a few large partly compressible ones, ~200 MB
//     compressed with -pull (-pull-size MB; 20 by default); a gzip and a zstd image
//     of the same tree, and a "whiteout" image, the gzip one plus a layer of
//     whiteouts (a file, a directory, a large file), an opaque directory refilled
//     and a large file replaced, and a layer making the deleted directory again;
//     /bin/busybox in the base layer so its containers run. They are served by the
//     in-process registry on 127.0.0.1. Each column pulls each image (-pull-images)
//     once a round with CRI PullImage, interleaved over -pull-rounds rounds (3 with
//     -pull, 1 by default; p50 reported), each pull by a daemon started on an empty
//     root and removed after (no GC to wait for): crisp, Debian's containerd 1.6,
//     and containerd 2.x from -containerd2 twice, with the transfer service's
//     max_concurrent_unpacks at 1 (its default: sequential) and at the number of
//     cores (parallel: its overlayfs snapshotter has the rebase capability this
//     needs). containerd 2.x's CRI plugin pulls through the transfer service here:
//     the registry is configured by a hosts.toml (config_path), not the mirrors
//     that would switch it to its local pull. For each pull: the wall time of
//     PullImage, and with a sync after it; the daemon's CPU (utime+stime of it and
//     of its reaped children, such as containerd's unpigz, from /proc/PID/stat);
//     its peak RSS (VmHWM, reset through clear_refs before the pull); and the bytes
//     it dirtied (/proc/PID/io write_bytes less cancelled_write_bytes: counted when
//     written to the page cache, so before writeback, and without journal or
//     metadata writes). The floor columns are the same blobs on local disk, each
//     `pigz -dc | tar -x` (zstd -dc for zstd; gzip -dc, with a warning, without
//     pigz: apt-get install pigz) into a directory of its own, all at once (floor)
//     or one after another (floor-seq), then sync. With -pull, -pull-pods (10)
//     clients at once each run a pod, pull the cold gzip image, and create and start
//     a `sleep` of it: the time until all run. crisp's ratios are to the lowest
//     containerd figure (the fastest configuration for times) and to the floor, with
//     the targets of issue 25 (pull ≤ 0.5× containerd and ≤ 1.3× floor, peak RSS ≤
//     containerd's, the pods ≤ 0.5× containerd's). -pull-runtimes picks columns;
//     -pull-rounds -1 skips the part.
//
// The pod start breakdown is crisp's alone: criserver serves its Prometheus metrics
// on a loopback port in every run (-crisp-metrics, on by default, since serving them
// was measured to cost nothing measurable; -crisp-metrics=false measures crisp
// without), and after the sequential cycles the bench scrapes them and reports the
// mean (sum/count) of each phase of crisp_pod_start_phase_duration_seconds and
// crisp_container_create_phase_duration_seconds. With -base=false it runs -cycles
// sequential cycles for that alone.
//
// Quick runs: BENCHFLAGS='-only crisp -base=false -density 10 -idle 5s -list-calls 20 -nri=false -tracing=false -wasm=false';
// the NRI cost alone: BENCHFLAGS='-only nri'; the tracing cost alone against the
// build before tracing: BENCHFLAGS='-only tracing -base-bin DIR'; WebAssembly pods
// against runc pods alone: BENCHFLAGS='-only wasm -cycles 40'.
// The pull benchmark alone at full size: BENCHFLAGS='-only pull -pull'.
//
// Runs of one -instance (0 by default) wait for each other (a lock next to their
// root): they share the root, the bridges, the subnets and the cgroup parents, and
// each removes what it finds there. Runs of different instances may run at once, for
// when several people share a machine; their figures then disturb each other.
package bench

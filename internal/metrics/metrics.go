// Package metrics owns criserver's Prometheus registry: the metrics the other
// components record, the ones read from their state at scrape time, and the HTTP
// handler that serves them.
//
// A nil *Metrics is valid and records nothing, so components (and their tests) take
// one without checking whether metrics are on.
package metrics

import (
	"context"
	"net/http"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
)

// namespace prefixes every metric of crisp's own.
const namespace = "crisp"

// Result label values.
const (
	ResultSuccess = "success"
	ResultError   = "error"
	// ResultFailure is the failed outcome of a config reload, named as CRI-O and
	// Prometheus name a reload that did not apply.
	ResultFailure = "failure"
)

// Phases of a pod start (label phase of crisp_pod_start_phase_duration_seconds).
const (
	PhaseNetNS        = "netns"
	PhaseCNI          = "cni"
	PhaseShimStart    = "shim_start"
	PhaseSandboxStart = "sandbox_start"
	// PhaseCreateSandbox and PhaseStartSandbox split sandbox_start into the shim's
	// CreateSandbox and StartSandbox calls.
	PhaseCreateSandbox = "create_sandbox"
	PhaseStartSandbox  = "start_sandbox"
	// PhasePodFiles is writing the pod's hostname, hosts and resolv.conf files.
	PhasePodFiles = "pod_files"
)

// Phases of a container create (label phase of
// crisp_container_create_phase_duration_seconds).
const (
	CreatePhaseSnapshot   = "snapshot"    // the writable layer prepared
	CreatePhaseUser       = "user_lookup" // the image's user resolved in its rootfs
	CreatePhaseSpec       = "spec"        // the OCI spec built
	CreatePhaseTaskCreate = "task_create" // the bundle written and the shim's task Create
)

// CNI operations (label operation of crisp_cni_operation_duration_seconds).
const (
	CNIAdd = "add"
	CNIDel = "del"
)

// Outcomes of a pod found at start (label outcome of crisp_recovered_pods_total).
const (
	RecoveredReconnected = "reconnected"
	RecoveredShimDead    = "shim_dead"
	RecoveredUndone      = "creation_undone"
)

// Buckets: the defaults stop at 10 s, which a pull or a pod start on a busy node
// passes; the low end resolves the few-millisecond phases of a pod start.
var (
	fastBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	slowBuckets = []float64{.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
)

// Metrics records what criserver does. Create it with New; a nil *Metrics is a no-op.
type Metrics struct {
	reg  *prometheus.Registry
	grpc *grpcprom.ServerMetrics

	podStart       prometheus.Histogram
	podStartPhase  *prometheus.HistogramVec
	ctrCreate      prometheus.Histogram
	ctrCreatePhase *prometheus.HistogramVec
	ctrStart       prometheus.Histogram
	cni            *prometheus.HistogramVec
	pulls          *prometheus.CounterVec
	pullBytes      prometheus.Counter
	pullDuration   *prometheus.HistogramVec
	shimsDead      prometheus.Counter
	recovered      *prometheus.CounterVec
	exits          *prometheus.CounterVec
	reloads        *prometheus.CounterVec
	lastReload     prometheus.Gauge
}

// New returns metrics registered in a registry of their own, with the Go runtime and
// process collectors of criserver.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		// The handling-time histogram has no code label (the provider's choice); the
		// handled counter has it. Methods are not pre-initialised: 17 codes for every
		// CRI method would be thousands of series nobody reads.
		grpc: grpcprom.NewServerMetrics(
			grpcprom.WithServerCounterOptions(grpcprom.WithNamespace(namespace)),
			grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramNamespace(namespace), grpcprom.WithHistogramBuckets(fastBuckets)),
		),
		podStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "pod_start_duration_seconds",
			Help:    "Time RunPodSandbox took for pods it started, end to end.",
			Buckets: fastBuckets,
		}),
		podStartPhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "pod_start_phase_duration_seconds",
			Help:    "Time of each part of a successful pod start: netns, cni (ADD, concurrent with the shim), shim_start (shim bootstrap; ~0 when a warm spare is adopted), sandbox_start (create_sandbox + start_sandbox in the shim), pod_files.",
			Buckets: fastBuckets,
		}, []string{"phase"}),
		ctrCreate: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "container_create_duration_seconds",
			Help:    "Time CreateContainer took for containers it created.",
			Buckets: fastBuckets,
		}),
		ctrCreatePhase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "container_create_phase_duration_seconds",
			Help:    "Time of each part of a successful container create: snapshot, user_lookup, spec, task_create.",
			Buckets: fastBuckets,
		}, []string{"phase"}),
		ctrStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "container_start_duration_seconds",
			Help:    "Time StartContainer took for containers it started.",
			Buckets: fastBuckets,
		}),
		cni: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "cni_operation_duration_seconds",
			Help:    "Time of CNI ADD and DEL of a pod's network (all plugins of the list), by operation and result.",
			Buckets: fastBuckets,
		}, []string{"operation", "result"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "image_pulls_total",
			Help: "Image pulls, by result.",
		}, []string{"result"}),
		pullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "image_pulled_bytes_total",
			Help: "Bytes downloaded from registries by successful image pulls.",
		}),
		pullDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "image_pull_duration_seconds",
			Help:    "Time of image pulls, download and unpack, by result.",
			Buckets: slowBuckets,
		}, []string{"result"}),
		shimsDead: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "shims_dead_total",
			Help: "Pod shims found dead (their pods were then killed).",
		}),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "recovered_pods_total",
			Help: "Pods found in the store when criserver started, by outcome: reconnected, shim_dead, creation_undone.",
		}, []string{"outcome"}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "container_exits_total",
			Help: "Container exits seen by criserver, by reason (Completed, Error, OOMKilled, Unknown).",
		}, []string{"reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "config_reloads_total",
			Help: "Reloads of the config file on SIGHUP, by result: success (applied) or failure (refused; the settings in force did not change).",
		}, []string{"result"}),
		lastReload: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "config_last_reload_success_timestamp_seconds",
			Help: "Unix time the config in force was loaded: at start, then at each successful reload.",
		}),
	}
	// Both results exist from the start, so that an alert on failures sees a 0 go to
	// 1 rather than a series appear.
	m.reloads.WithLabelValues(ResultSuccess)
	m.reloads.WithLabelValues(ResultFailure)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.grpc, m.podStart, m.podStartPhase, m.ctrCreate, m.ctrCreatePhase, m.ctrStart, m.cni,
		m.pulls, m.pullBytes, m.pullDuration, m.shimsDead, m.recovered, m.exits,
		m.reloads, m.lastReload,
	)
	return m
}

// Path is the one path the metrics listener serves.
const Path = "/metrics"

// Handler serves the registry at Path in the Prometheus exposition formats and
// nothing else: every other path is 404, so the listener exposes no more than metrics.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	// A pattern without a trailing slash matches that path alone.
	mux.Handle(Path, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	return mux
}

// Registry is where the metrics live; tests gather from it.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// UnaryServerInterceptor counts and times every unary CRI call by method and code.
func (m *Metrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	if m == nil {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(ctx, req)
		}
	}
	return m.grpc.UnaryServerInterceptor()
}

// StreamServerInterceptor counts and times every streaming CRI call (GetContainerEvents,
// the streaming lists) by method and code.
func (m *Metrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	if m == nil {
		return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, ss)
		}
	}
	return m.grpc.StreamServerInterceptor()
}

// ObservePodStart records a RunPodSandbox that started its pod in d.
func (m *Metrics) ObservePodStart(d time.Duration) {
	if m != nil {
		m.podStart.Observe(d.Seconds())
	}
}

// ObservePodStartPhase records one part (Phase*) of a pod start.
func (m *Metrics) ObservePodStartPhase(phase string, d time.Duration) {
	if m != nil {
		m.podStartPhase.WithLabelValues(phase).Observe(d.Seconds())
	}
}

// ObserveContainerCreate records a CreateContainer that created its container in d.
func (m *Metrics) ObserveContainerCreate(d time.Duration) {
	if m != nil {
		m.ctrCreate.Observe(d.Seconds())
	}
}

// ObserveContainerCreatePhase records one part (CreatePhase*) of a container create.
func (m *Metrics) ObserveContainerCreatePhase(phase string, d time.Duration) {
	if m != nil {
		m.ctrCreatePhase.WithLabelValues(phase).Observe(d.Seconds())
	}
}

// ObserveContainerStart records a StartContainer that started its container in d.
func (m *Metrics) ObserveContainerStart(d time.Duration) {
	if m != nil {
		m.ctrStart.Observe(d.Seconds())
	}
}

// ObserveCNI records a CNI operation (CNIAdd, CNIDel) that took d and failed with err.
func (m *Metrics) ObserveCNI(op string, d time.Duration, err error) {
	if m != nil {
		m.cni.WithLabelValues(op, result(err)).Observe(d.Seconds())
	}
}

// ObservePull records an image pull that took d and failed with err; bytes is what it
// downloaded when it succeeded.
func (m *Metrics) ObservePull(d time.Duration, bytes int64, err error) {
	if m == nil {
		return
	}
	r := result(err)
	m.pulls.WithLabelValues(r).Inc()
	m.pullDuration.WithLabelValues(r).Observe(d.Seconds())
	if err == nil && bytes > 0 {
		m.pullBytes.Add(float64(bytes))
	}
}

// ShimDied counts a pod shim found dead.
func (m *Metrics) ShimDied() {
	if m != nil {
		m.shimsDead.Inc()
	}
}

// PodRecovered counts a pod found at start with its outcome (Recovered*).
func (m *Metrics) PodRecovered(outcome string) {
	if m != nil {
		m.recovered.WithLabelValues(outcome).Inc()
	}
}

// ContainerExited counts a container exit with the reason the CRI reports for it.
func (m *Metrics) ContainerExited(reason string) {
	if m != nil {
		m.exits.WithLabelValues(reason).Inc()
	}
}

// ConfigLoaded records that the config in force was loaded now; criserver calls it
// at start, ConfigReloaded at each successful reload.
func (m *Metrics) ConfigLoaded() {
	if m != nil {
		m.lastReload.SetToCurrentTime()
	}
}

// ConfigReloaded counts a reload of the config file that failed with err (nil: applied).
func (m *Metrics) ConfigReloaded(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.reloads.WithLabelValues(ResultFailure).Inc()
		return
	}
	m.reloads.WithLabelValues(ResultSuccess).Inc()
	m.ConfigLoaded()
}

func result(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultSuccess
}

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The Watch methods register metrics read from a component's state when Prometheus
// scrapes, so that nothing is updated on the hot path for them. Each is called once,
// by the component that owns the state, before criserver serves; the functions must
// be cheap and safe for concurrent use.

// WatchPods reports the pods criserver knows (crisp_pods).
func (m *Metrics) WatchPods(count func() int) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "pods",
		Help: "Pod sandboxes criserver knows, ready or not.",
	}, func() float64 { return float64(count()) }))
}

// WatchShims reports the pod shims criserver is connected to (crisp_shims).
func (m *Metrics) WatchShims(count func() int) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "shims",
		Help: "Pod shim processes criserver is connected to.",
	}, func() float64 { return float64(count()) }))
}

// WatchContainers reports the containers by state (crisp_containers{state}).
func (m *Metrics) WatchContainers(byState func() map[string]int) {
	if m == nil {
		return
	}
	m.reg.MustRegister(&containersCollector{byState: byState, desc: prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "containers"),
		"Containers criserver knows, by CRI state (created, running, exited).",
		[]string{"state"}, nil)})
}

type containersCollector struct {
	byState func() map[string]int
	desc    *prometheus.Desc
}

func (c *containersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *containersCollector) Collect(ch chan<- prometheus.Metric) {
	for state, n := range c.byState() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), state)
	}
}

// WatchImages reports the image store: how many images and their size
// (crisp_images, crisp_image_store_bytes).
func (m *Metrics) WatchImages(stats func() (count int, bytes int64)) {
	if m == nil {
		return
	}
	m.reg.MustRegister(&imagesCollector{stats: stats,
		count: prometheus.NewDesc(prometheus.BuildFQName(namespace, "", "images"),
			"Images in the store.", nil, nil),
		bytes: prometheus.NewDesc(prometheus.BuildFQName(namespace, "image_store", "bytes"),
			"Size of the images in the store as ListImages reports it (compressed layers and config).", nil, nil),
	})
}

type imagesCollector struct {
	stats        func() (int, int64)
	count, bytes *prometheus.Desc
}

func (c *imagesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.count; ch <- c.bytes }

func (c *imagesCollector) Collect(ch chan<- prometheus.Metric) {
	n, b := c.stats()
	ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(b))
}

// WatchContainerEvents reports the GetContainerEvents subscribers and the events
// dropped for subscribers too slow to read them (crisp_container_event_subscribers,
// crisp_container_events_dropped_total). dropped must never decrease.
func (m *Metrics) WatchContainerEvents(subscribers func() int, dropped func() uint64) {
	if m == nil {
		return
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "container_event_subscribers",
			Help: "GetContainerEvents streams open.",
		}, func() float64 { return float64(subscribers()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "container_events_dropped_total",
			Help: "Container events dropped for GetContainerEvents subscribers whose buffer was full.",
		}, func() float64 { return float64(dropped()) }),
	)
}

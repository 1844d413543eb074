package config

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// Cgroup drivers criserver understands; kubelet's cgroupDriver must match.
const (
	CgroupDriverCgroupfs = "cgroupfs"
	CgroupDriverSystemd  = "systemd"
)

// Default free-space reserve of the image filesystem: enough that a node whose disk a
// pull would fill still has room for logs, the metadata database and container writes.
const (
	DefaultImageMinFreeBytes   = 512 << 20
	DefaultImageMinFreePercent = 5
)

// Config is everything criserver can be told; Default() gives working values.
type Config struct {
	// Socket is the CRI gRPC unix socket kubelet and crictl dial.
	Socket string `toml:"socket" comment:"CRI gRPC unix socket (mode 0660)"`
	// RootDir holds persistent state: the metadata database and pod files.
	RootDir string `toml:"root_dir" comment:"persistent state: metadata database, pod files"`
	// StateDir holds runtime state that does not survive a reboot: netns pins, shim sockets, bundles.
	StateDir string `toml:"state_dir" comment:"volatile state: network namespaces, shim sockets, bundles"`
	// LogLevel is one of debug, info, warn, error.
	LogLevel string `toml:"log_level" comment:"debug, info, warn or error"`
	// CgroupDriver is cgroupfs or systemd; reported to kubelet by RuntimeConfig.
	CgroupDriver string `toml:"cgroup_driver" comment:"cgroupfs or systemd (must match kubelet's cgroupDriver)"`
	// DefaultRuntimeHandler is used when a pod asks for the empty handler.
	DefaultRuntimeHandler string `toml:"default_runtime_handler" comment:"handler used when a pod names none"`
	// ShimStartTimeout bounds how long a shim may take to start and answer, in seconds.
	ShimStartTimeoutSeconds int `toml:"shim_start_timeout_seconds" comment:"how long a shim may take to start and answer"`
	// DisableAppArmor leaves every container without an AppArmor profile on a host
	// that has AppArmor (containerd's disable_apparmor); asking for one is then refused.
	DisableAppArmor bool `toml:"disable_apparmor" comment:"on a host with AppArmor, give containers no profile (otherwise crisp-default is loaded and applied to every non-privileged container that does not ask for another or for unconfined)"`
	// EnableSELinux gives, on a host with SELinux enabled, every pod its own MCS level
	// and its containers and files the policy's container labels (containerd's
	// enable_selinux, CRI-O's selinux). Off by default, as containerd's: under
	// enforcing, only a shim whose binary has the container engine's exec type may
	// start a process as container_t, and only the package installs that label (and
	// turns this on in its config); a bare binary with this on would stop every
	// container on exactly the nodes that enforce SELinux. A host without SELinux is
	// unaffected.
	EnableSELinux bool `toml:"enable_selinux" comment:"on a host with SELinux enabled, label pods and containers with the policy's container types and a unique MCS level per pod (no effect without SELinux)"`
	// SELinuxCategoryRange is the number of MCS categories pods' levels are drawn
	// from (containerd's selinux_category_range; 1024 is the policy's usual c0.c1023).
	SELinuxCategoryRange int `toml:"selinux_category_range" comment:"MCS categories pod levels are drawn from (c0 to c<range-1>)"`
	// EventBuffer is how many container events one GetContainerEvents subscriber may
	// have waiting before further events are dropped for it (and counted).
	EventBuffer int `toml:"event_buffer" comment:"container events buffered per GetContainerEvents subscriber; more are dropped"`
	// CNI configures pod networking.
	CNI CNIConfig `toml:"cni"`
	// Registry configures image pulls.
	Registry RegistryConfig `toml:"registry"`
	// Image configures the image store.
	Image ImageConfig `toml:"image"`
	// Streaming configures the exec/attach/port-forward HTTP server.
	Streaming StreamingConfig `toml:"streaming"`
	// CDI configures Container Device Interface devices.
	CDI CDIConfig `toml:"cdi"`
	// Metrics configures the Prometheus metrics listener.
	Metrics MetricsConfig `toml:"metrics"`
	// NRI configures the Node Resource Interface (containerd's [plugins."io.containerd.nri.v1.nri"] keys).
	NRI NRIConfig `toml:"nri"`
	// Tracing configures OpenTelemetry traces of CRI calls, down into the shims.
	Tracing TracingConfig `toml:"tracing"`
	// Runtimes maps a runtime handler (RuntimeClass) name to the shim that runs its pods.
	Runtimes map[string]Runtime `toml:"runtimes"`
}

// NRIConfig configures the Node Resource Interface: plugins that see every pod and
// container event and may adjust containers before they are created. The keys and
// their defaults are containerd's, except Disable: containerd 2.x turns NRI on by
// default, crisp leaves it off, because its socket lets any local root process that
// connects inject mounts, devices and hooks into every container created afterwards;
// a node that runs NRI plugins asks for it.
type NRIConfig struct {
	// Disable turns NRI off (the default); false starts it with criserver.
	Disable bool `toml:"disable" comment:"turn NRI off (crisp's default; containerd 2.x defaults to on)"`
	// SocketPath is where external plugins connect.
	SocketPath string `toml:"socket_path" comment:"unix socket NRI plugins connect to"`
	// PluginPath holds pre-registered plugins, started by criserver (NN-name executables).
	PluginPath string `toml:"plugin_path" comment:"directory of pre-registered plugins (executables named NN-name) criserver starts"`
	// PluginConfigPath holds the configuration files of pre-registered plugins.
	PluginConfigPath string `toml:"plugin_config_path" comment:"directory of pre-registered plugins' configuration (NN-name.conf or name.conf)"`
	// PluginRegistrationTimeout bounds how long a plugin may take to register.
	PluginRegistrationTimeout Duration `toml:"plugin_registration_timeout" comment:"how long a plugin may take to register, e.g. \"5s\""`
	// PluginRequestTimeout bounds how long a plugin may take to answer one event; a
	// plugin that takes longer is disconnected and the call goes on without it.
	PluginRequestTimeout Duration `toml:"plugin_request_timeout" comment:"how long a plugin may take to answer an event before it is disconnected, e.g. \"2s\""`
	// DisableConnections refuses external plugins: only pre-registered ones run.
	DisableConnections bool `toml:"disable_connections" comment:"do not listen on socket_path: only pre-registered plugins run"`
	// DefaultValidator is the NRI library's built-in validator of plugins'
	// adjustments, containerd's [nri.default_validator] (off by default, as there).
	DefaultValidator NRIValidatorConfig `toml:"default_validator"`
}

// NRIValidatorConfig configures the NRI library's default validator: what it
// refuses of the adjustments plugins ask for at CreateContainer, failing the create.
// The keys and defaults are containerd 2.4's [plugins."io.containerd.nri.v1.nri".default_validator].
type NRIValidatorConfig struct {
	// Enable turns the validator on; the Reject keys and required plugins act only then.
	Enable bool `toml:"enable" comment:"validate NRI plugins' container adjustments (the keys below act only when true)"`
	// RejectOCIHookAdjustment refuses a plugin's OCI hooks.
	RejectOCIHookAdjustment bool `toml:"reject_oci_hook_adjustment" comment:"refuse adjustments that add OCI hooks"`
	// RejectRuntimeDefaultSeccompAdjustment refuses a seccomp change of a container
	// whose profile is RuntimeDefault.
	RejectRuntimeDefaultSeccompAdjustment bool `toml:"reject_runtime_default_seccomp_adjustment" comment:"refuse seccomp changes of RuntimeDefault containers"`
	// RejectUnconfinedSeccompAdjustment refuses a seccomp change of a container that
	// is Unconfined or names no profile.
	RejectUnconfinedSeccompAdjustment bool `toml:"reject_unconfined_seccomp_adjustment" comment:"refuse seccomp changes of Unconfined containers (and of those that name no profile)"`
	// RejectCustomSeccompAdjustment refuses a seccomp change of a container whose
	// profile is Localhost.
	RejectCustomSeccompAdjustment bool `toml:"reject_custom_seccomp_adjustment" comment:"refuse seccomp changes of Localhost-profile containers"`
	// RejectNamespaceAdjustment refuses any change of the container's namespaces.
	RejectNamespaceAdjustment bool `toml:"reject_namespace_adjustment" comment:"refuse adjustments that add, replace or remove namespaces"`
	// RejectSysctlAdjustment refuses any sysctl a plugin sets.
	RejectSysctlAdjustment bool `toml:"reject_sysctl_adjustment" comment:"refuse adjustments that set sysctls"`
	// RequiredPlugins must all be connected for a container to be created.
	RequiredPlugins []string `toml:"required_plugins" comment:"plugins (by name) that must be connected for any container to be created"`
	// TolerateMissingAnnotation names a pod annotation that, "true", lets a
	// container be created without the required plugins.
	TolerateMissingAnnotation string `toml:"tolerate_missing_plugins_annotation" comment:"pod annotation key that, set to \"true\", lets a container start without required_plugins"`
}

// Duration is a time.Duration written as a Go duration string ("2s", "500ms"), as
// containerd writes its NRI timeouts.
type Duration time.Duration

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (n NRIConfig) validate() error {
	if n.Disable {
		return nil
	}
	for key, p := range map[string]string{"nri.socket_path": n.SocketPath, "nri.plugin_path": n.PluginPath, "nri.plugin_config_path": n.PluginConfigPath} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("%s: %q must be an absolute path", key, p)
		}
	}
	for _, name := range n.DefaultValidator.RequiredPlugins {
		if strings.TrimSpace(name) == "" {
			return errors.New("nri.default_validator.required_plugins: an empty plugin name: list plugins by the name they register with")
		}
	}
	if n.SocketPath == "" && !n.DisableConnections {
		return errors.New("nri.socket_path must be set unless nri.disable_connections is true")
	}
	for key, d := range map[string]Duration{"nri.plugin_registration_timeout": n.PluginRegistrationTimeout, "nri.plugin_request_timeout": n.PluginRequestTimeout} {
		if d <= 0 || time.Duration(d) > maxSeconds*time.Second {
			return fmt.Errorf("%s must be positive and at most a week, got %s", key, time.Duration(d))
		}
	}
	return nil
}

// MetricsConfig configures the Prometheus metrics listener.
type MetricsConfig struct {
	// Address is the host:port serving /metrics over plain HTTP; empty turns metrics
	// off. It has no authentication: keep it on loopback or a node-local network.
	Address string `toml:"address" comment:"host:port serving Prometheus metrics at /metrics (e.g. 127.0.0.1:9942); empty turns metrics off"`
}

// Tracing protocols: OTLP over gRPC (the collector's port 4317) or over HTTP with
// protobuf bodies (port 4318), as OTEL_EXPORTER_OTLP_PROTOCOL names them.
const (
	TracingProtocolGRPC = "grpc"
	TracingProtocolHTTP = "http/protobuf"
)

// TracingConfig configures OpenTelemetry tracing: a span per CRI call that continues
// the caller's trace context (kubelet sends it in the gRPC metadata), child spans for
// the phases of the call, and the pod's shim's spans, exported over OTLP. The keys are
// containerd's (its otlp exporter and tracing plugin) and CRI-O's ([crio.tracing]).
type TracingConfig struct {
	// Enable turns tracing on; off by default, when crisp records and sends nothing.
	Enable bool `toml:"enable" comment:"export OpenTelemetry traces of CRI calls (off by default)"`
	// Endpoint is the collector: host:port, or a URL whose http:// scheme also means
	// Insecure. Empty is the protocol's default on loopback.
	Endpoint string `toml:"endpoint" comment:"OTLP collector: host:port or http(s)://host:port[/path]; empty: 127.0.0.1:4317 (grpc) or 127.0.0.1:4318 (http/protobuf)"`
	// Protocol is TracingProtocolGRPC or TracingProtocolHTTP.
	Protocol string `toml:"protocol" comment:"grpc or http/protobuf"`
	// Insecure sends without TLS (a collector on the node or in the pod network).
	Insecure bool `toml:"insecure" comment:"send without TLS"`
	// SamplingRatio is the share of traces crisp starts itself that are sampled; a
	// call that arrives with a trace context follows its caller's decision.
	SamplingRatio float64 `toml:"sampling_ratio" comment:"share (0 to 1) of traces crisp starts that are sampled; calls with a caller's trace context follow its decision"`
	// ServiceName is service.name of criserver's spans; the shims' are it plus "-shim".
	ServiceName string `toml:"service_name" comment:"service.name of criserver's spans (the shims' get \"-shim\" appended)"`
}

func (t TracingConfig) validate() error {
	if t.Protocol != TracingProtocolGRPC && t.Protocol != TracingProtocolHTTP {
		return fmt.Errorf("tracing.protocol must be %q or %q, got %q", TracingProtocolGRPC, TracingProtocolHTTP, t.Protocol)
	}
	if t.SamplingRatio < 0 || t.SamplingRatio > 1 || math.IsNaN(t.SamplingRatio) {
		return fmt.Errorf("tracing.sampling_ratio must be between 0 and 1, got %v", t.SamplingRatio)
	}
	if t.ServiceName == "" {
		return fmt.Errorf("tracing.service_name must not be empty")
	}
	if _, err := t.Target(); err != nil {
		return err
	}
	return nil
}

// TracingTarget is where spans go, parsed from TracingConfig.
type TracingTarget struct {
	// HostPort is the collector's host:port.
	HostPort string
	// Path is the URL path of an HTTP endpoint ("" for the exporter's /v1/traces).
	Path string
	// Insecure is true for Insecure or an http:// endpoint.
	Insecure bool
}

// Target parses Endpoint for Protocol.
func (t TracingConfig) Target() (TracingTarget, error) {
	out := TracingTarget{Insecure: t.Insecure}
	ep := t.Endpoint
	switch {
	case ep == "" && t.Protocol == TracingProtocolHTTP:
		out.HostPort = "127.0.0.1:4318"
		return out, nil
	case ep == "":
		out.HostPort = "127.0.0.1:4317"
		return out, nil
	case strings.Contains(ep, "://"):
		u, err := url.Parse(ep)
		if err != nil {
			return out, fmt.Errorf("tracing.endpoint %q: %w", ep, err)
		}
		switch u.Scheme {
		case "http":
			out.Insecure = true
		case "https":
		default:
			return out, fmt.Errorf("tracing.endpoint %q: the scheme must be http or https", ep)
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return out, fmt.Errorf("tracing.endpoint %q: only scheme, host, port and path are allowed", ep)
		}
		if u.Path != "" && u.Path != "/" && t.Protocol == TracingProtocolGRPC {
			return out, fmt.Errorf("tracing.endpoint %q: a grpc endpoint has no path", ep)
		}
		if u.Path != "/" {
			out.Path = u.Path
		}
		ep = u.Host
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil || host == "" {
		return out, fmt.Errorf("tracing.endpoint must be host:port or http(s)://host:port[/path], got %q", t.Endpoint)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return out, fmt.Errorf("tracing.endpoint %q: port must be 1 to 65535", t.Endpoint)
	}
	out.HostPort = ep
	return out, nil
}

// CDIConfig says where CDI spec files are found. A CRI CDIDevices entry or a
// cdi.k8s.io/ annotation names a device that one of these files describes.
type CDIConfig struct {
	// SpecDirs are scanned in order; a device defined in a later directory overrides
	// the same device in an earlier one (the CDI library's priority rule). Empty
	// turns CDI off: requests for CDI devices are then refused.
	SpecDirs []string `toml:"spec_dirs" comment:"CDI spec directories, later ones take priority; empty turns CDI off"`
}

// StreamingConfig configures the streaming server whose URLs Exec, Attach and
// PortForward return; kubelet (or the API server) connects to it directly.
type StreamingConfig struct {
	// Address is the IP the server listens on; loopback by default because the
	// server has no authentication of its own: its URLs carry single-use tokens.
	Address string `toml:"address" comment:"IP the streaming server listens on"`
	// Port is the TCP port; 0 picks a free one at start.
	Port int `toml:"port" comment:"TCP port of the streaming server; 0 picks a free port"`
	// TLSCertFile and TLSKeyFile, both or neither, make the server serve HTTPS.
	TLSCertFile string `toml:"tls_cert_file" comment:"PEM certificate for HTTPS (with tls_key_file); empty serves plain HTTP"`
	TLSKeyFile  string `toml:"tls_key_file" comment:"PEM private key for HTTPS (with tls_cert_file)"`
	// IdleTimeoutSeconds closes a stream connection with no traffic for this long.
	IdleTimeoutSeconds int `toml:"idle_timeout_seconds" comment:"close streaming connections idle this long"`
}

// RegistryConfig says how registries are reached.
type RegistryConfig struct {
	// Mirrors maps a registry host to mirror endpoints tried in order before it.
	Mirrors map[string][]string `toml:"mirrors" comment:"registry host -> mirror endpoints tried first, e.g. {\"docker.io\" = [\"https://mirror.example\"]}"`
	// Insecure lists registries reached over plain HTTP or with unverified TLS.
	Insecure []string `toml:"insecure" comment:"hosts (host or host:port) allowed over plain HTTP or unverified TLS; localhost is always allowed over HTTP"`
	// MaxConcurrentDownloads bounds parallel layer downloads per pull.
	MaxConcurrentDownloads int `toml:"max_concurrent_downloads" comment:"layers downloaded at once per pull"`
	// ConfigPath is a directory of containerd-style host directories
	// (<host>/hosts.toml, certificates), read again on every pull.
	ConfigPath string `toml:"config_path" comment:"directory of containerd hosts.toml host directories (e.g. /etc/crisp/certs.d or /etc/containerd/certs.d), re-read on every pull; empty: none"`
	// AuthFile is a Docker/containers config.json whose credentials are used when a
	// pull request carries none.
	AuthFile string `toml:"auth_file" comment:"node credentials (Docker config.json format), used when a pull carries no credentials; empty: none"`
}

// ImageConfig configures the image store.
type ImageConfig struct {
	// Pinned images are reported pinned so kubelet's image GC never removes them.
	Pinned []string `toml:"pinned" comment:"image references kubelet's image GC must never remove"`
	// MinFreeBytes and MinFreePercent are the free space a pull must leave on the image
	// filesystem (the one holding root_dir/images); the larger of the two applies and 0
	// disables either. A layer can unpack to far more than it downloads (a small gzip of
	// a huge sparse file), so unpacking is checked as it goes, not only up front. The
	// defaults sit below kubelet's image GC (85 % used) and imagefs eviction (15 % free)
	// thresholds, so on a node kubelet acts first and the reserve is the last line that
	// keeps the node's own writes (logs, the metadata database, container layers) working.
	MinFreeBytes   int64   `toml:"min_free_bytes" comment:"free bytes a pull must leave on the image filesystem (the larger of this and min_free_percent applies; 0 disables)"`
	MinFreePercent float64 `toml:"min_free_percent" comment:"free space, in percent of the image filesystem's size, a pull must leave (0 disables)"`
	// PullProgressTimeout cancels a pull whose bytes stop arriving for this long;
	// kubelet gives PullImage no deadline of its own. 0 disables it.
	PullProgressTimeout Duration `toml:"pull_progress_timeout" comment:"cancel a pull that receives no bytes for this long, e.g. \"5m\" (0s disables)"`
	// SignaturePolicy is a containers-policy.json(5) file enforced at pull; empty: off.
	SignaturePolicy string `toml:"signature_policy" comment:"containers-policy.json(5) file every pull must satisfy; empty: no signature policy"`
}

// CNIConfig configures libcni and the default network written on a fresh node.
type CNIConfig struct {
	ConfDir string   `toml:"conf_dir" comment:"CNI network configs; the lexically first one is used"`
	BinDirs []string `toml:"bin_dirs" comment:"directories searched for CNI plugin binaries"`
	// DefaultBridge and DefaultSubnet shape the config written when ConfDir has none.
	DefaultBridge string `toml:"default_bridge" comment:"bridge of the config written when conf_dir has none"`
	DefaultSubnet string `toml:"default_subnet" comment:"pod subnet of the config written when conf_dir has none"`
	// TimeoutSeconds bounds the CNI ADD, and the DEL, of a pod's network (all plugins of
	// the list together); a plugin still running then is killed. kubelet gives
	// RunPodSandbox 4 min and StopPodSandbox 2: 60 s leaves room for the rest of
	// either call, as CRI-O's 1 min network teardown bound does.
	TimeoutSeconds int `toml:"timeout_seconds" comment:"how long the CNI ADD or DEL of one pod may take before its plugin is killed"`
	// Masquerade is "runtime" or "plugin": who masquerades the traffic pods of a bridge
	// network with ipMasq send out of their subnet. With "runtime" crisp gives the
	// bridge plugin ipMasq false (in memory) and keeps one rule per pod subnet in nat
	// chain CRISP-POSTROUTING, instead of the plugin's chain per pod (~60 ms per pod).
	Masquerade string `toml:"masquerade" comment:"runtime: crisp keeps one MASQUERADE rule per pod subnet for bridge networks with ipMasq (host-local IPAM); plugin: the bridge plugin adds a chain per pod"`
}

// Runtime is one runtime handler: the shim binary that runs its pods.
type Runtime struct {
	// Shim is the shim binary: an absolute path, or a name looked up next to criserver and on PATH.
	Shim string `toml:"shim" comment:"shim binary: absolute path, or a name found next to criserver or on PATH"`
	// Namespace is passed to the shim as -namespace.
	Namespace string `toml:"namespace,omitempty"`
	// WarmSpare keeps one started, idle shim ready for the handler's next pod, so that
	// starting a shim (fork/exec, the Go runtime's start, the socket) is not part of
	// RunPodSandbox. A table that leaves it out gets true, except a task-only handler's
	// (sandbox_mode "task"), whose spare is another project's shim kept idle.
	WarmSpare bool `toml:"warm_spare" comment:"keep one idle shim started for the handler's next pod: takes the shim start off RunPodSandbox for one idle shim's memory"`
	// SandboxMode says what the shim serves: "sandbox" (the Sandbox API, as crisp's own
	// shim does) or "task" (only the task API, as containerd-shim-runc-v2, gVisor's and
	// Kata's shims do: crisp then runs the pod's sandbox as a pause container through
	// the task API, as containerd's podsandbox does).
	SandboxMode string `toml:"sandbox_mode,omitempty" comment:"sandbox: the shim serves the Sandbox API (crisp's own); task: a task-only shim (containerd-shim-runc-v2, runsc, kata)"`
	// Options are the shim's runtime options, sent with every task Create as containerd
	// sends them: a runc shim gets containerd.runc.v1.Options (BinaryName, Root,
	// SystemdCgroup, ...), any other shim runtimeoptions.v1.Options (TypeUrl,
	// ConfigPath, ConfigBody). Only for sandbox_mode "task".
	Options map[string]any `toml:"options,omitempty" comment:"runtime options of a task-only shim (runc: BinaryName, Root, SystemdCgroup, ...; others: TypeUrl, ConfigPath, ConfigBody)"`
}

// Sandbox modes of a runtime handler.
const (
	SandboxModeSandbox = "sandbox"
	SandboxModeTask    = "task"
)

// Mode is the handler's sandbox mode, "sandbox" when unset.
func (r Runtime) Mode() string {
	if r.SandboxMode == "" {
		return SandboxModeSandbox
	}
	return r.SandboxMode
}

// Default returns the settings criserver runs with when no file is given.
func Default() Config {
	return Config{
		Socket:                  "/run/crisp/crisp.sock",
		RootDir:                 "/var/lib/crisp",
		StateDir:                "/run/crisp",
		LogLevel:                "info",
		CgroupDriver:            CgroupDriverCgroupfs,
		DefaultRuntimeHandler:   "runc",
		ShimStartTimeoutSeconds: 30,
		EventBuffer:             1024,
		SELinuxCategoryRange:    1024,
		CNI: CNIConfig{
			ConfDir:        "/etc/cni/net.d",
			BinDirs:        []string{"/usr/lib/cni", "/opt/cni/bin"},
			DefaultBridge:  "crisp0",
			DefaultSubnet:  "10.88.0.0/16",
			TimeoutSeconds: 60,
			Masquerade:     "runtime",
		},
		Registry: RegistryConfig{
			Mirrors:                map[string][]string{},
			Insecure:               []string{},
			MaxConcurrentDownloads: 3,
		},
		Image: ImageConfig{
			Pinned:         []string{},
			MinFreeBytes:   DefaultImageMinFreeBytes,
			MinFreePercent: DefaultImageMinFreePercent,
			// containerd's image_pull_progress_timeout default.
			PullProgressTimeout: Duration(5 * time.Minute),
		},
		Streaming: StreamingConfig{
			Address:            "127.0.0.1",
			IdleTimeoutSeconds: 14400,
		},
		CDI: CDIConfig{
			SpecDirs: []string{"/etc/cdi", "/var/run/cdi"},
		},
		NRI: NRIConfig{
			Disable:                   true,
			SocketPath:                "/var/run/nri/nri.sock",
			PluginPath:                "/opt/nri/plugins",
			PluginConfigPath:          "/etc/nri/conf.d",
			PluginRegistrationTimeout: Duration(5 * time.Second),
			PluginRequestTimeout:      Duration(2 * time.Second),
		},
		Tracing: TracingConfig{
			Protocol:      TracingProtocolGRPC,
			SamplingRatio: 1,
			ServiceName:   "crisp",
		},
		Runtimes: map[string]Runtime{
			"runc": {Shim: "shim-runc", Namespace: "k8s.io", WarmSpare: true},
			// WebAssembly pods (RuntimeClass handler "wasm"), built and shipped with
			// shim-runc. No warm spare: most nodes rarely run one, and a spare would be
			// an idle shim on every node.
			"wasm": {Shim: "shim-wasm", Namespace: "k8s.io"},
		},
	}
}

// Load reads a TOML file over the defaults: keys the file leaves out keep their default.
func Load(path string) (Config, error) {
	cfg := Default()
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config %s: %w", path, err)
	}
	// A file that names its own runtimes replaces the default table rather than merging
	// into it, so an operator can remove the default handler.
	var probe struct {
		Runtimes map[string]any `toml:"runtimes"`
	}
	if err := toml.Unmarshal(data, &probe); err != nil {
		return Config{}, fmt.Errorf("parse config %s: %w", path, err)
	}
	if probe.Runtimes != nil {
		cfg.Runtimes = nil
	}
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			return Config{}, fmt.Errorf("parse config %s: unknown key: %s", path, strict.String())
		}
		return Config{}, fmt.Errorf("parse config %s: %w", path, err)
	}
	// warm_spare defaults to true in every table the file gives, not only in the
	// default one it replaces; for a task-only shim, whose spare is a shim of another
	// project kept idle, it must be asked for.
	for name, v := range probe.Runtimes {
		if t, ok := v.(map[string]any); ok {
			if _, set := t["warm_spare"]; !set && cfg.Runtimes[name].Mode() == SandboxModeSandbox {
				r := cfg.Runtimes[name]
				r.WarmSpare = true
				cfg.Runtimes[name] = r
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Validate reports the first setting that cannot work, naming the key.
func (c Config) Validate() error {
	for key, p := range map[string]string{"socket": c.Socket, "root_dir": c.RootDir, "state_dir": c.StateDir, "cni.conf_dir": c.CNI.ConfDir} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%s must be an absolute path, got %q", key, p)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level must be debug, info, warn or error, got %q", c.LogLevel)
	}
	switch c.CgroupDriver {
	case CgroupDriverCgroupfs, CgroupDriverSystemd:
	default:
		return fmt.Errorf("cgroup_driver must be %q or %q, got %q", CgroupDriverCgroupfs, CgroupDriverSystemd, c.CgroupDriver)
	}
	if err := checkSeconds("shim_start_timeout_seconds", c.ShimStartTimeoutSeconds); err != nil {
		return err
	}
	if c.EventBuffer <= 0 {
		return fmt.Errorf("event_buffer must be positive, got %d", c.EventBuffer)
	}
	if c.SELinuxCategoryRange < 2 {
		// Two distinct categories make a pod's level.
		return fmt.Errorf("selinux_category_range must be at least 2, got %d", c.SELinuxCategoryRange)
	}
	if len(c.Runtimes) == 0 {
		return errors.New("no runtime handler configured: add a [runtimes.NAME] table")
	}
	if _, ok := c.Runtimes[c.DefaultRuntimeHandler]; !ok {
		return fmt.Errorf("default_runtime_handler %q is not a configured runtime (have %s)", c.DefaultRuntimeHandler, strings.Join(c.HandlerNames(), ", "))
	}
	for name, r := range c.Runtimes {
		if r.Shim == "" {
			return fmt.Errorf("runtimes.%s.shim is empty", name)
		}
		switch r.Mode() {
		case SandboxModeSandbox:
			if len(r.Options) > 0 {
				return fmt.Errorf("runtimes.%s.options is only for sandbox_mode = %q (crisp's own shim takes none)", name, SandboxModeTask)
			}
		case SandboxModeTask:
		default:
			return fmt.Errorf("runtimes.%s.sandbox_mode must be %q or %q, got %q", name, SandboxModeSandbox, SandboxModeTask, r.SandboxMode)
		}
	}
	if c.Registry.MaxConcurrentDownloads <= 0 {
		return fmt.Errorf("registry.max_concurrent_downloads must be positive, got %d", c.Registry.MaxConcurrentDownloads)
	}
	for key, p := range map[string]string{"registry.config_path": c.Registry.ConfigPath, "registry.auth_file": c.Registry.AuthFile} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("%s: %q must be an absolute path", key, p)
		}
	}
	for host, eps := range c.Registry.Mirrors {
		for _, ep := range eps {
			if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") {
				return fmt.Errorf("registry.mirrors.%q: endpoint %q must start with http:// or https://", host, ep)
			}
		}
	}
	if len(c.CNI.BinDirs) == 0 {
		return errors.New("cni.bin_dirs is empty")
	}
	if err := checkSeconds("cni.timeout_seconds", c.CNI.TimeoutSeconds); err != nil {
		return err
	}
	if c.CNI.Masquerade != "runtime" && c.CNI.Masquerade != "plugin" {
		return fmt.Errorf("cni.masquerade must be \"runtime\" or \"plugin\", got %q", c.CNI.Masquerade)
	}
	if _, _, err := net.ParseCIDR(c.CNI.DefaultSubnet); err != nil {
		return fmt.Errorf("cni.default_subnet: %w", err)
	}
	if n := len(c.CNI.DefaultBridge); n == 0 || n > 15 {
		return fmt.Errorf("cni.default_bridge must be 1 to 15 characters, got %q", c.CNI.DefaultBridge)
	}
	if err := c.Image.validate(); err != nil {
		return err
	}
	if err := c.CDI.validate(); err != nil {
		return err
	}
	if err := c.Metrics.validate(); err != nil {
		return err
	}
	if err := c.NRI.validate(); err != nil {
		return err
	}
	if err := c.Tracing.validate(); err != nil {
		return err
	}
	return c.Streaming.validate()
}

func (m MetricsConfig) validate() error {
	if m.Address == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(m.Address)
	if err != nil {
		return fmt.Errorf("metrics.address must be host:port or empty, got %q: %w", m.Address, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("metrics.address: port must be 0 to 65535, got %q", port)
	}
	return nil
}

// maxSeconds bounds every duration setting: a week is longer than any of them
// sensibly is, and far below what a time.Duration holds (seconds beyond ~292 years
// would overflow into a negative duration).
const maxSeconds = 7 * 24 * 3600

// checkSeconds refuses a duration setting that is not positive or absurdly long.
func checkSeconds(key string, v int) error {
	if v <= 0 || v > maxSeconds {
		return fmt.Errorf("%s must be positive and at most %d (a week), got %d", key, maxSeconds, v)
	}
	return nil
}

func (i ImageConfig) validate() error {
	if i.MinFreeBytes < 0 {
		return fmt.Errorf("image.min_free_bytes must be 0 (off) or a positive number of bytes, got %d", i.MinFreeBytes)
	}
	// NaN fails both comparisons, so it is refused too.
	if !(i.MinFreePercent >= 0 && i.MinFreePercent < 100) {
		return fmt.Errorf("image.min_free_percent must be at least 0 (off) and below 100, got %v", i.MinFreePercent)
	}
	if t := time.Duration(i.PullProgressTimeout); t < 0 || t > maxSeconds*time.Second {
		return fmt.Errorf("image.pull_progress_timeout must be 0s (off) or a positive duration of at most a week, got %v", t)
	} else if t > 0 && t < time.Second {
		return fmt.Errorf("image.pull_progress_timeout must be at least 1s (or 0s: off), got %v; it is a time without any byte, not a pull's duration", t)
	}
	if i.SignaturePolicy != "" && !filepath.IsAbs(i.SignaturePolicy) {
		return fmt.Errorf("image.signature_policy: %q must be an absolute path", i.SignaturePolicy)
	}
	return nil
}

func (c CDIConfig) validate() error {
	for _, d := range c.SpecDirs {
		if !filepath.IsAbs(d) {
			return fmt.Errorf("cdi.spec_dirs: %q must be an absolute path", d)
		}
	}
	return nil
}

func (s StreamingConfig) validate() error {
	if net.ParseIP(s.Address) == nil {
		return fmt.Errorf("streaming.address must be an IP address, got %q", s.Address)
	}
	if s.Port < 0 || s.Port > 65535 {
		return fmt.Errorf("streaming.port must be 0 to 65535, got %d", s.Port)
	}
	if (s.TLSCertFile == "") != (s.TLSKeyFile == "") {
		return errors.New("streaming.tls_cert_file and streaming.tls_key_file must be set together")
	}
	for key, p := range map[string]string{"streaming.tls_cert_file": s.TLSCertFile, "streaming.tls_key_file": s.TLSKeyFile} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("%s must be an absolute path, got %q", key, p)
		}
	}
	return checkSeconds("streaming.idle_timeout_seconds", s.IdleTimeoutSeconds)
}

// HandlerNames lists the configured runtime handlers in order.
func (c Config) HandlerNames() []string {
	names := make([]string, 0, len(c.Runtimes))
	for n := range c.Runtimes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Marshal renders the config as TOML, with a comment per key.
func (c Config) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	enc := toml.NewEncoder(&buf)
	enc.SetIndentTables(true)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	return buf.Bytes(), nil
}

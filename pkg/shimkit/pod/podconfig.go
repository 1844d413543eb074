package pod

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
	"github.com/crisp-runtime/crisp/internal/podfiles"
)

// podSandboxConfigName is the CRI message containerd ≥ 2.0's shim sandboxer puts in
// CreateSandboxRequest.options (typeurl.MarshalAny of the RunPodSandbox config).
const podSandboxConfigName = "runtime.v1.PodSandboxConfig"

// pauseOOMScoreAdj is what containerd gives a pod's pause process (and crisp's own
// controller asks for); buildSpec's caller clamps it to what the shim may set.
const pauseOOMScoreAdj = -998

// CRI NamespaceMode values (k8s.io/cri-api runtime.v1 api.proto).
const (
	criModePod       = 0
	criModeContainer = 1
	criModeNode      = 2
	criModeTarget    = 3
)

// isPodSandboxConfig reports whether an Any's type URL names the CRI PodSandboxConfig,
// with or without a "type.googleapis.com/"-style prefix: typeurl writes the bare name.
func isPodSandboxConfig(typeURL string) bool {
	return typeURL[strings.LastIndexByte(typeURL, '/')+1:] == podSandboxConfigName
}

// podConfig is the part of a CRI PodSandboxConfig the shim acts on. The message is
// decoded by field number (k8s.io/cri-api v0.37 pkg/apis/runtime/v1/api.proto) rather
// than with cri-api's generated package, which links gRPC into every shim and would
// register "runtime.v1.*" a second time in any binary that also links cri-api.
type podConfig struct {
	name, hostname, cgroupParent string
	network, pid, ipc            int32
	userns                       *criUserNS
	sysctls                      map[string]string
	dns                          podfiles.DNS
}

type criUserNS struct {
	mode       int32
	uids, gids [][3]uint32 // host_id, container_id, length
}

// optionsFromPodConfig maps containerd's PodSandboxConfig onto crisp's SandboxOptions,
// the one form buildSpec validates, the way crisp's own CRI server does
// (internal/cri/sandbox.go RunPodSandbox): the hostname defaults to the pod name and a pod on
// the host network keeps the host's UTS namespace; sysctl keys may use "/"; the pause
// process gets containerd's oom_score_adj. containerd gives no cgroup driver to the
// sandboxer, so it follows from the parent's form: kubelet's systemd driver passes a
// slice name ("kubepods-besteffort-pod….slice"), its cgroupfs driver an absolute path.
// The pod's files (/etc/hostname, /etc/hosts, /etc/resolv.conf), which containerd's
// podsandbox would write, come back too, checked (podfiles.Pod.Validate): under the
// shim sandboxer they are the shim's.
func optionsFromPodConfig(data []byte) (*optionsv1.SandboxOptions, *podfiles.Pod, error) {
	pc, err := decodePodConfig(data)
	if err != nil {
		return nil, nil, invalid("decode %s: %v", podSandboxConfigName, err)
	}
	o := &optionsv1.SandboxOptions{
		CgroupParent:  pc.cgroupParent,
		SystemdCgroup: pc.cgroupParent != "" && !strings.HasPrefix(pc.cgroupParent, "/"),
		OomScoreAdj:   pauseOOMScoreAdj,
		Sysctls:       make(map[string]string, len(pc.sysctls)),
	}
	var err1, err2, err3 error
	o.Network, err1 = criMode("network", pc.network)
	o.Pid, err2 = criMode("pid", pc.pid)
	o.Ipc, err3 = criMode("ipc", pc.ipc)
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return nil, nil, err
		}
	}
	if o.Network == optionsv1.NamespaceMode_NODE {
		// A pod on the host network keeps the host's hostname, as kubelet expects.
		o.Uts = optionsv1.NamespaceMode_NODE
	} else {
		o.Hostname = pc.hostname
		if o.Hostname == "" {
			o.Hostname = pc.name
			if len(o.Hostname) > maxHostname {
				o.Hostname = o.Hostname[:maxHostname]
			}
		}
	}
	for k, v := range pc.sysctls {
		o.Sysctls[strings.ReplaceAll(k, "/", ".")] = v
	}
	if u := pc.userns; u != nil {
		switch u.mode {
		case criModeNode:
		case criModePod:
			o.Userns = &optionsv1.UserNamespace{Uids: criIDMaps(u.uids), Gids: criIDMaps(u.gids)}
		default:
			return nil, nil, invalid("user namespace mode %d: want POD or NODE", u.mode)
		}
	}
	files := &podfiles.Pod{Hostname: o.Hostname, HostNetwork: o.Network == optionsv1.NamespaceMode_NODE, DNS: pc.dns}
	// containerd passes kubelet's DNS config and the hostname on unchecked: they get
	// the checks crisp's CRI server makes before it writes the same files, here, before
	// the shim makes anything of the pod.
	if err := files.Validate(); err != nil {
		return nil, nil, err
	}
	return o, files, nil
}

func criMode(name string, m int32) (optionsv1.NamespaceMode, error) {
	switch m {
	case criModePod:
		return optionsv1.NamespaceMode_POD, nil
	case criModeContainer:
		return optionsv1.NamespaceMode_CONTAINER, nil
	case criModeNode:
		return optionsv1.NamespaceMode_NODE, nil
	case criModeTarget:
		return 0, invalid("%s namespace mode TARGET is for containers, not pods", name)
	}
	return 0, invalid("%s namespace mode %d is not POD, CONTAINER or NODE", name, m)
}

func criIDMaps(ms [][3]uint32) []*optionsv1.IDMapping {
	out := make([]*optionsv1.IDMapping, 0, len(ms))
	for _, m := range ms {
		out = append(out, &optionsv1.IDMapping{HostId: m[0], ContainerId: m[1], Size: m[2]})
	}
	return out
}

// decodePodConfig reads the fields podConfig holds and skips the rest.
func decodePodConfig(b []byte) (*podConfig, error) {
	pc := &podConfig{}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType: // metadata
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num == 1 && typ == protowire.BytesType { // name
					pc.name = string(v)
				}
				return nil
			})
		case num == 2 && typ == protowire.BytesType: // hostname
			pc.hostname = string(v)
		case num == 4 && typ == protowire.BytesType: // dns_config
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if typ != protowire.BytesType {
					return nil
				}
				switch num { // DNSConfig: servers 1, searches 2, options 3
				case 1:
					pc.dns.Servers = append(pc.dns.Servers, string(v))
				case 2:
					pc.dns.Searches = append(pc.dns.Searches, string(v))
				case 3:
					pc.dns.Options = append(pc.dns.Options, string(v))
				}
				return nil
			})
		case num == 8 && typ == protowire.BytesType: // linux
			return decodeLinux(v, pc)
		}
		return nil
	})
	return pc, err
}

// decodeLinux reads LinuxPodSandboxConfig.
func decodeLinux(b []byte, pc *podConfig) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType: // cgroup_parent
			pc.cgroupParent = string(v)
		case num == 2 && typ == protowire.BytesType: // security_context
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num == 1 && typ == protowire.BytesType { // namespace_options
					return decodeNamespaceOptions(v, pc)
				}
				return nil
			})
		case num == 3 && typ == protowire.BytesType: // sysctls (map entry: key 1, value 2)
			var k, val string
			if err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if typ == protowire.BytesType && num == 1 {
					k = string(v)
				} else if typ == protowire.BytesType && num == 2 {
					val = string(v)
				}
				return nil
			}); err != nil {
				return err
			}
			if pc.sysctls == nil {
				pc.sysctls = map[string]string{}
			}
			pc.sysctls[k] = val
		}
		return nil
	})
}

// decodeNamespaceOptions reads NamespaceOption.
func decodeNamespaceOptions(b []byte, pc *podConfig) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			pc.network = int32(n)
		case num == 2 && typ == protowire.VarintType:
			pc.pid = int32(n)
		case num == 3 && typ == protowire.VarintType:
			pc.ipc = int32(n)
		case num == 5 && typ == protowire.BytesType: // userns_options
			u := &criUserNS{}
			pc.userns = u
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
				switch {
				case num == 1 && typ == protowire.VarintType:
					u.mode = int32(n)
				case (num == 2 || num == 3) && typ == protowire.BytesType:
					var m [3]uint32 // IDMapping: host_id 1, container_id 2, length 3
					if err := eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, n uint64) error {
						if typ == protowire.VarintType && num >= 1 && num <= 3 {
							if n > 1<<32-1 {
								return fmt.Errorf("id mapping field %d: %d does not fit in 32 bits", num, n)
							}
							m[num-1] = uint32(n)
						}
						return nil
					}); err != nil {
						return err
					}
					if num == 2 {
						u.uids = append(u.uids, m)
					} else {
						u.gids = append(u.gids, m)
					}
				}
				return nil
			})
		}
		return nil
	})
}

// eachField calls fn for every field of a message: v holds a length-delimited field's
// bytes, n a varint's value; other wire types are skipped after validation.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, tl := protowire.ConsumeTag(b)
		if tl < 0 {
			return protowire.ParseError(tl)
		}
		b = b[tl:]
		var (
			v  []byte
			n  uint64
			fl int
		)
		switch typ {
		case protowire.VarintType:
			n, fl = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, fl = protowire.ConsumeBytes(b)
		default:
			fl = protowire.ConsumeFieldValue(num, typ, b)
		}
		if fl < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(fl))
		}
		b = b[fl:]
		if err := fn(num, typ, v, n); err != nil {
			return err
		}
	}
	return nil
}

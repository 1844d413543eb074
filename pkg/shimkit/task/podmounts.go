package task

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/crisp-runtime/crisp/api/annotations"
	"github.com/crisp-runtime/crisp/internal/atomicfile"
	"github.com/crisp-runtime/crisp/internal/podfiles"
)

// Container paths of the pod's files.
const (
	etcHostname = "/etc/hostname"
	etcHosts    = "/etc/hosts"
	resolvConf  = "/etc/resolv.conf"
	devShm      = "/dev/shm"
)

// addPodMounts gives a container of the pod the shim serves the pod's /etc/hostname,
// /etc/hosts, /etc/resolv.conf and /dev/shm, by rewriting the bundle's config.json.
// Under containerd's shim sandboxer containerd mounts only the files it finds in its
// own sandbox directory (internal/cri/server/container_create.go linuxContainerMounts),
// which its podsandbox writes and the shim sandboxer does not: the shim wrote them
// (sandbox.Service.PodFiles), so it adds what the spec lacks, as containerd would. A
// path the spec already mounts (kubelet's /etc/hosts, a volume at /dev/shm) is left
// alone, and only containerd's default tmpfs /dev/shm is replaced by the pod's. The
// rest of config.json is kept byte for byte: fields the OCI types here do not know
// survive.
func addPodMounts(bundle, sandboxID string, files podfiles.Paths) (bool, error) {
	path := filepath.Join(bundle, specFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("read spec: %w", err)
	}
	var spec specs.Spec
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &spec); err != nil {
		return false, fmt.Errorf("parse %s: %w", path, err)
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return false, fmt.Errorf("parse %s: %w", path, err)
	}
	if spec.Annotations[annotations.ContainerType] != annotations.ContainerTypeContainer || spec.Annotations[annotations.SandboxID] != sandboxID {
		return false, nil
	}
	var mounts []json.RawMessage
	if m, ok := raw["mounts"]; ok {
		if err := json.Unmarshal(m, &mounts); err != nil {
			return false, fmt.Errorf("parse mounts of %s: %w", path, err)
		}
	}
	mode := "rw"
	if spec.Root != nil && spec.Root.Readonly {
		mode = "ro"
	}
	has := func(dst string) int {
		return slices.IndexFunc(spec.Mounts, func(m specs.Mount) bool { return filepath.Clean(m.Destination) == dst })
	}
	changed := false
	for _, f := range []struct{ dst, src string }{{etcHostname, files.Hostname}, {etcHosts, files.Hosts}, {resolvConf, files.Resolv}} {
		if f.src == "" || has(f.dst) >= 0 {
			continue
		}
		m, err := json.Marshal(specs.Mount{Destination: f.dst, Type: "bind", Source: f.src, Options: []string{"rbind", "rprivate", mode}})
		if err != nil {
			return false, err
		}
		mounts = append(mounts, m)
		changed = true
	}
	if files.Shm != "" && sharesIPC(&spec) {
		m, err := json.Marshal(specs.Mount{Destination: devShm, Type: "bind", Source: files.Shm, Options: []string{"rbind", "rprivate", "rw"}})
		if err != nil {
			return false, err
		}
		switch i := has(devShm); {
		case i < 0:
			mounts = append(mounts, m)
			changed = true
		case spec.Mounts[i].Type == "tmpfs" && spec.Mounts[i].Source == "shm":
			// containerd's default spec (oci.WithDefaultSpec) gives each container a
			// tmpfs of its own; the pod's containers share one, as they share IPC.
			mounts[i] = m
			changed = true
		}
	}
	if !changed {
		return false, nil
	}
	if raw["mounts"], err = json.Marshal(mounts); err != nil {
		return false, err
	}
	out, err := json.Marshal(raw)
	if err != nil {
		return false, err
	}
	perm := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		perm = fi.Mode().Perm()
	}
	return true, atomicfile.Write(path, out, perm)
}

// sharesIPC reports whether the container joins an IPC namespace: the pod's /dev/shm
// goes with the pod's IPC namespace, and a host-IPC container keeps the host's.
func sharesIPC(spec *specs.Spec) bool {
	if spec.Linux == nil {
		return false
	}
	return slices.ContainsFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.IPCNamespace })
}

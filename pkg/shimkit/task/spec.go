package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/selinux/go-selinux"
)

// specFile is the OCI runtime spec the caller writes into the bundle.
const specFile = "config.json"

// Type URLs containerd's typeurl gives the OCI types carried in Any fields as JSON.
const (
	processTypeURL   = "types.containerd.io/opencontainers/runtime-spec/1/Process"
	resourcesTypeURL = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources"
)

// LoadSpec reads and checks the OCI spec of a bundle (config.json): it has a root path
// and a valid process.
func LoadSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, specFile))
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(bundle, specFile), err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return nil, errors.New("spec has no root.path")
	}
	if err := validateProcess(spec.Process); err != nil {
		return nil, err
	}
	return &spec, nil
}

// labelledProcess reports whether, on an SELinux host, the process of the bundle's
// spec runs with an SELinux label of its own (ioConfig.labelled). Only that field is
// decoded; a spec that cannot be read says no, and fails later where it is loaded.
func labelledProcess(bundle string) bool {
	if !selinux.GetEnabled() {
		return false
	}
	data, err := os.ReadFile(filepath.Join(bundle, specFile))
	if err != nil {
		return false
	}
	var spec struct {
		Process *struct {
			SelinuxLabel string `json:"selinuxLabel"`
		} `json:"process"`
	}
	if json.Unmarshal(data, &spec) != nil || spec.Process == nil {
		return false
	}
	return spec.Process.SelinuxLabel != ""
}

// validateProcess does what runc's validateProcessSpec does, so that a bad process fails
// as InvalidArgument here and not as an init error.
func validateProcess(p *specs.Process) error {
	switch {
	case p == nil:
		return errors.New("spec has no process")
	case len(p.Args) == 0:
		return errors.New("process.args must not be empty")
	case p.Cwd == "" || !filepath.IsAbs(p.Cwd):
		return fmt.Errorf("process.cwd %q must be an absolute path", p.Cwd)
	}
	return nil
}

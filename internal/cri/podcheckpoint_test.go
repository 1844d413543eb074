package cri

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestEmptyOutputDir(t *testing.T) {
	empty := t.TempDir()
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(empty, link); err != nil {
		t.Fatal(err)
	}
	if got, err := emptyOutputDir(empty + "/"); err != nil || got != empty {
		t.Fatalf("empty dir: %q %v", got, err)
	}
	for name, tc := range map[string]struct {
		path  string
		check func(error) bool
	}{
		"none":      {"", errdefs.IsInvalidArgument},
		"relative":  {"out", errdefs.IsInvalidArgument},
		"missing":   {filepath.Join(empty, "missing"), errdefs.IsInvalidArgument},
		"file":      {filepath.Join(full, "x"), errdefs.IsInvalidArgument},
		"symlink":   {link, errdefs.IsInvalidArgument},
		"not empty": {full, errdefs.IsFailedPrecondition},
	} {
		if _, err := emptyOutputDir(tc.path); err == nil || !tc.check(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestNoOptions(t *testing.T) {
	if err := noOptions(nil); err != nil {
		t.Fatal(err)
	}
	if err := noOptions(map[string]string{"b": "1", "a": "2"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("options accepted: %v", err)
	}
}

func writeManifest(t *testing.T, m podCheckpoint) string {
	t.Helper()
	dir := t.TempDir()
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, podManifest), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestReadPodCheckpoint(t *testing.T) {
	good := podCheckpoint{Version: podManifestVersion, Containers: []podCheckpointContainer{{Name: "a", Archive: "container-0.tar"}}}
	dir := writeManifest(t, good)
	if got, m, err := readPodCheckpoint(dir); err != nil || got != dir || len(m.Containers) != 1 {
		t.Fatalf("good manifest: %q %v %v", got, m, err)
	}
	for name, m := range map[string]podCheckpoint{
		"version":       {Version: 99, Containers: good.Containers},
		"no containers": {Version: podManifestVersion},
		"escape":        {Version: podManifestVersion, Containers: []podCheckpointContainer{{Name: "a", Archive: "../../etc/shadow"}}},
		"dotdot":        {Version: podManifestVersion, Containers: []podCheckpointContainer{{Name: "a", Archive: ".."}}},
		"no name":       {Version: podManifestVersion, Containers: []podCheckpointContainer{{Archive: "c.tar"}}},
	} {
		if _, _, err := readPodCheckpoint(writeManifest(t, m)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, p := range []string{"", "rel", t.TempDir()} {
		if _, _, err := readPodCheckpoint(p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("path %q: %v", p, err)
		}
	}
}

func TestMatchContainerConfigs(t *testing.T) {
	m := &podCheckpoint{Containers: []podCheckpointContainer{{Name: "a"}, {Name: "b"}}}
	cfg := func(name string) *runtime.ContainerConfig {
		return &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: name}}
	}
	got, err := matchContainerConfigs("/c", m, []*runtime.ContainerConfig{cfg("b"), cfg("a")})
	if err != nil || got[0].Metadata.Name != "a" || got[1].Metadata.Name != "b" {
		t.Fatalf("match: %v %v", got, err)
	}
	for name, cfgs := range map[string][]*runtime.ContainerConfig{
		"none":      nil,
		"missing":   {cfg("a")},
		"extra":     {cfg("a"), cfg("b"), cfg("c")},
		"duplicate": {cfg("a"), cfg("a"), cfg("b")},
		"no name":   {cfg("a"), cfg("b"), cfg("")},
		"other":     {cfg("a"), cfg("c")},
	} {
		if _, err := matchContainerConfigs("/c", m, cfgs); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

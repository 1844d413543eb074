package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRestartKeys(t *testing.T) {
	cases := []struct {
		name        string
		change      func(c *Config)
		wantChanged []string
		wantRestart []string
	}{
		{name: "nothing", change: func(*Config) {}},
		{name: "log level", change: func(c *Config) { c.LogLevel = "debug" }, wantChanged: []string{"log_level"}},
		{name: "registry and image settings reload", change: func(c *Config) {
			c.Registry.Mirrors = map[string][]string{"docker.io": {"https://m.example"}}
			c.Registry.Insecure = []string{"reg.example:5000"}
			c.Registry.MaxConcurrentDownloads = 9
			c.Registry.ConfigPath = "/etc/crisp/certs.d"
			c.Registry.AuthFile = "/etc/crisp/auth.json"
			c.Image.PullProgressTimeout = Duration(time.Minute)
			c.Image.SignaturePolicy = "/etc/containers/policy.json"
			c.Image.Pinned = []string{"registry.k8s.io/pause:3.10"}
		}, wantChanged: []string{"image.pinned", "image.pull_progress_timeout", "image.signature_policy", "registry.auth_file",
			"registry.config_path", "registry.insecure", "registry.max_concurrent_downloads", "registry.mirrors"}},
		{name: "top-level keys need a restart", change: func(c *Config) {
			c.Socket = "/run/other.sock"
			c.CgroupDriver = CgroupDriverSystemd
		}, wantChanged: []string{"cgroup_driver", "socket"}, wantRestart: []string{"cgroup_driver", "socket"}},
		{name: "nested tables name the key", change: func(c *Config) {
			c.Streaming.Port = 10010
			c.NRI.DefaultValidator.RejectSysctlAdjustment = true
			c.Image.MinFreeBytes = 1
		}, wantChanged: []string{"image.min_free_bytes", "nri.default_validator.reject_sysctl_adjustment", "streaming.port"},
			wantRestart: []string{"image.min_free_bytes", "nri.default_validator.reject_sysctl_adjustment", "streaming.port"}},
		{name: "a runtime added", change: func(c *Config) {
			c.Runtimes["kata"] = Runtime{Shim: "/usr/bin/shim-kata"}
		}, wantChanged: []string{"runtimes"}, wantRestart: []string{"runtimes"}},
		{name: "a runtime's options", change: func(c *Config) {
			r := c.Runtimes["runc"]
			r.Options = map[string]any{"BinaryName": "/usr/sbin/runc"}
			c.Runtimes["runc"] = r
		}, wantChanged: []string{"runtimes"}, wantRestart: []string{"runtimes"}},
		{name: "mixed", change: func(c *Config) {
			c.LogLevel = "error"
			c.Metrics.Address = "127.0.0.1:9942"
			c.CNI.BinDirs = []string{"/usr/lib/cni"}
		}, wantChanged: []string{"cni.bin_dirs", "log_level", "metrics.address"}, wantRestart: []string{"cni.bin_dirs", "metrics.address"}},
		{name: "empty and missing lists are the same", change: func(c *Config) {
			c.Registry.Mirrors = nil
			c.Registry.Insecure = nil
			c.Image.Pinned = nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := Default(), Default()
			// Default's maps are fresh per call, so a change to cur leaves old alone.
			tc.change(&cur)
			if got := ChangedKeys(old, cur); !slices.Equal(got, tc.wantChanged) {
				t.Errorf("ChangedKeys = %q, want %q", got, tc.wantChanged)
			}
			if got := RestartKeys(old, cur); !slices.Equal(got, tc.wantRestart) {
				t.Errorf("RestartKeys = %q, want %q", got, tc.wantRestart)
			}
		})
	}
}

// leafKeys lists every key ChangedKeys can report, with a setter that changes it.
func leafKeys(prefix string, v reflect.Value, out map[string]reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if f.Type.Kind() == reflect.Struct {
			leafKeys(prefix+name+".", v.Field(i), out)
			continue
		}
		out[prefix+name] = v.Field(i)
	}
}

// change gives v a value different from the one it has.
func change(t *testing.T, key string, v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "-changed")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.Slice:
		v.Set(reflect.Append(reflect.MakeSlice(v.Type(), 0, 1), reflect.Zero(v.Type().Elem())))
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("added-by-test"), reflect.Zero(v.Type().Elem()))
		v.Set(m)
	default:
		t.Fatalf("%s: no way to change a %s: teach the test", key, v.Kind())
	}
}

// TestChangedKeysComplete changes every key of Config alone and checks that exactly
// it is reported, so a key added later is seen by the reload's restart warning, and
// that every reloadable key names a real key.
func TestChangedKeysComplete(t *testing.T) {
	probe := Default()
	keys := map[string]reflect.Value{}
	leafKeys("", reflect.ValueOf(&probe).Elem(), keys)
	for key := range keys {
		cur := Default()
		fields := map[string]reflect.Value{}
		leafKeys("", reflect.ValueOf(&cur).Elem(), fields)
		change(t, key, fields[key])
		got := ChangedKeys(Default(), cur)
		if !slices.Equal(got, []string{key}) {
			t.Errorf("changing %s alone: ChangedKeys = %q", key, got)
		}
		wantRestart := []string{key}
		if Reloadable(key) {
			wantRestart = nil
		}
		if got := RestartKeys(Default(), cur); !slices.Equal(got, wantRestart) {
			t.Errorf("changing %s alone: RestartKeys = %q, want %q", key, got, wantRestart)
		}
	}
	for key := range reloadable {
		if _, ok := keys[key]; !ok {
			t.Errorf("reloadable key %q is not a key of Config", key)
		}
	}
	if len(keys) < 40 {
		t.Errorf("only %d keys found: the walk misses tables", len(keys))
	}
}

// TestReloaded: after a reload the reloadable keys are the file's and the others
// keep their running values, so the next reload of the same file warns again about
// exactly those, and a file put back as it was warns about nothing.
func TestReloaded(t *testing.T) {
	running := Default()
	file := Default()
	file.LogLevel = "debug"
	file.Registry.Mirrors = map[string][]string{"docker.io": {"https://m.example"}}
	file.Image.Pinned = []string{"busybox"}
	file.Socket = "/run/other.sock"
	file.Streaming.Port = 10010

	got := Reloaded(running, file)
	if got.LogLevel != "debug" || len(got.Registry.Mirrors) != 1 || !slices.Equal(got.Image.Pinned, []string{"busybox"}) {
		t.Errorf("reloadable keys not taken from the file: %+v", got)
	}
	if got.Socket != running.Socket || got.Streaming.Port != running.Streaming.Port {
		t.Errorf("restart keys changed: socket %s, streaming.port %d", got.Socket, got.Streaming.Port)
	}
	want := []string{"socket", "streaming.port"}
	if keys := ChangedKeys(got, file); !slices.Equal(keys, want) {
		t.Errorf("ChangedKeys(reloaded, file) = %q, want %q", keys, want)
	}
	if keys := RestartKeys(got, Default()); len(keys) != 0 {
		t.Errorf("file put back: RestartKeys = %q, want none", keys)
	}
	if running.LogLevel != "info" {
		t.Errorf("Reloaded changed its argument: log_level %s", running.LogLevel)
	}
}

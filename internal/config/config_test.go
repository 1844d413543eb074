package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefaultRoundTrip(t *testing.T) {
	def := Default()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	data, err := def.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatalf("load printed defaults: %v\n%s", err, data)
	}
	if got.Socket != def.Socket || got.RootDir != def.RootDir || !reflect.DeepEqual(got.Runtimes["runc"], def.Runtimes["runc"]) || got.CNI.DefaultSubnet != def.CNI.DefaultSubnet ||
		got.Image.MinFreeBytes != def.Image.MinFreeBytes || got.Image.MinFreePercent != def.Image.MinFreePercent {
		t.Fatalf("round trip changed config: %+v", got)
	}
	for _, key := range []string{"min_free_bytes = 536870912", "min_free_percent = 5.0"} {
		if !strings.Contains(string(data), key) {
			t.Errorf("printed defaults lack %q:\n%s", key, data)
		}
	}
}

func TestLoad(t *testing.T) {
	cases := []struct {
		name    string
		file    string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{name: "empty file keeps defaults", file: "", check: func(t *testing.T, c Config) {
			if c.Socket != "/run/crisp/crisp.sock" {
				t.Errorf("socket = %q", c.Socket)
			}
		}},
		{name: "override", file: "socket = \"/tmp/x.sock\"\n[cni]\nconf_dir = \"/tmp/net\"\n", check: func(t *testing.T, c Config) {
			if c.Socket != "/tmp/x.sock" || c.CNI.ConfDir != "/tmp/net" || len(c.CNI.BinDirs) != 2 {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "runtimes replace defaults", file: "default_runtime_handler = \"kata\"\n[runtimes.kata]\nshim = \"/usr/bin/shim-kata\"\n", check: func(t *testing.T, c Config) {
			if _, ok := c.Runtimes["runc"]; ok || c.Runtimes["kata"].Shim != "/usr/bin/shim-kata" {
				t.Errorf("runtimes = %+v", c.Runtimes)
			}
		}},
		{name: "warm spare on by default", file: "", check: func(t *testing.T, c Config) {
			if !c.Runtimes["runc"].WarmSpare {
				t.Errorf("runtimes.runc.warm_spare = false by default")
			}
		}},
		{name: "warm spare defaults on in a file's own runtimes", file: "default_runtime_handler = \"a\"\n[runtimes.a]\nshim = \"/s\"\n[runtimes.b]\nshim = \"/s\"\nwarm_spare = false\n[runtimes.c]\nshim = \"/s\"\nwarm_spare = true\n", check: func(t *testing.T, c Config) {
			if !c.Runtimes["a"].WarmSpare || c.Runtimes["b"].WarmSpare || !c.Runtimes["c"].WarmSpare {
				t.Errorf("warm_spare a, b, c = %v, %v, %v; want true, false, true", c.Runtimes["a"].WarmSpare, c.Runtimes["b"].WarmSpare, c.Runtimes["c"].WarmSpare)
			}
		}},
		{name: "task-only shim with options", file: "[runtimes.runc]\nshim = \"/s\"\n[runtimes.runc-v2]\nshim = \"containerd-shim-runc-v2\"\nsandbox_mode = \"task\"\n[runtimes.runc-v2.options]\nBinaryName = \"/usr/sbin/runc\"\nSystemdCgroup = false\n", check: func(t *testing.T, c Config) {
			r := c.Runtimes["runc-v2"]
			if r.Mode() != SandboxModeTask || r.WarmSpare || r.Options["BinaryName"] != "/usr/sbin/runc" || r.Options["SystemdCgroup"] != false {
				t.Errorf("runtimes.runc-v2 = %+v; want task mode, no warm spare, the options", r)
			}
			if c.Runtimes["runc"].Mode() != SandboxModeSandbox || !c.Runtimes["runc"].WarmSpare {
				t.Errorf("runtimes.runc = %+v; want sandbox mode with a warm spare", c.Runtimes["runc"])
			}
		}},
		{name: "unknown sandbox mode", file: "[runtimes.runc]\nshim = \"/s\"\nsandbox_mode = \"vm\"\n", wantErr: "sandbox_mode"},
		{name: "warm spare on a task-only shim is asked for", file: "[runtimes.runc]\nshim = \"/s\"\nsandbox_mode = \"task\"\nwarm_spare = true\n", check: func(t *testing.T, c Config) {
			if !c.Runtimes["runc"].WarmSpare {
				t.Errorf("runtimes.runc.warm_spare = false, want the file's true")
			}
		}},
		{name: "options on a sandbox shim", file: "[runtimes.runc]\nshim = \"/s\"\n[runtimes.runc.options]\nRoot = \"/r\"\n", wantErr: "options is only for"},
		{name: "warm spare not a bool", file: "[runtimes.runc]\nshim = \"/s\"\nwarm_spare = \"yes\"\n", wantErr: "warm_spare"},
		{name: "cdi spec dirs default", file: "", check: func(t *testing.T, c Config) {
			if strings.Join(c.CDI.SpecDirs, ",") != "/etc/cdi,/var/run/cdi" {
				t.Errorf("cdi.spec_dirs = %q", c.CDI.SpecDirs)
			}
		}},
		{name: "cdi spec dirs set", file: "[cdi]\nspec_dirs = [\"/opt/cdi\"]\n", check: func(t *testing.T, c Config) {
			if strings.Join(c.CDI.SpecDirs, ",") != "/opt/cdi" {
				t.Errorf("cdi.spec_dirs = %q", c.CDI.SpecDirs)
			}
		}},
		{name: "cdi off", file: "[cdi]\nspec_dirs = []\n", check: func(t *testing.T, c Config) {
			if len(c.CDI.SpecDirs) != 0 {
				t.Errorf("cdi.spec_dirs = %q", c.CDI.SpecDirs)
			}
		}},
		{name: "cdi relative dir", file: "[cdi]\nspec_dirs = [\"etc/cdi\"]\n", wantErr: "cdi.spec_dirs: \"etc/cdi\" must be an absolute path"},
		{name: "unknown key", file: "sockett = \"/x\"\n", wantErr: "unknown key"},
		{name: "relative path", file: "root_dir = \"var/lib\"\n", wantErr: "root_dir must be an absolute path"},
		{name: "bad driver", file: "cgroup_driver = \"cgroupv3\"\n", wantErr: "cgroup_driver"},
		{name: "default handler missing", file: "default_runtime_handler = \"nope\"\n", wantErr: "default_runtime_handler \"nope\""},
		{name: "bad subnet", file: "[cni]\ndefault_subnet = \"10.1.2\"\n", wantErr: "cni.default_subnet"},
		{name: "cni timeout default", file: "", check: func(t *testing.T, c Config) {
			if c.CNI.TimeoutSeconds != 60 {
				t.Errorf("cni.timeout_seconds = %d, want 60", c.CNI.TimeoutSeconds)
			}
		}},
		{name: "cni timeout set", file: "[cni]\ntimeout_seconds = 2\n", check: func(t *testing.T, c Config) {
			if c.CNI.TimeoutSeconds != 2 {
				t.Errorf("cni.timeout_seconds = %d, want 2", c.CNI.TimeoutSeconds)
			}
		}},
		{name: "nri defaults: containerd's paths and timeouts, off", file: "", check: func(t *testing.T, c Config) {
			want := NRIConfig{Disable: true, SocketPath: "/var/run/nri/nri.sock", PluginPath: "/opt/nri/plugins", PluginConfigPath: "/etc/nri/conf.d",
				PluginRegistrationTimeout: Duration(5 * time.Second), PluginRequestTimeout: Duration(2 * time.Second)}
			if !reflect.DeepEqual(c.NRI, want) {
				t.Errorf("nri = %+v, want %+v", c.NRI, want)
			}
		}},
		{name: "nri on with timeouts", file: "[nri]\ndisable = false\nsocket_path = \"/tmp/n.sock\"\nplugin_request_timeout = \"500ms\"\nplugin_registration_timeout = \"1m\"\n", check: func(t *testing.T, c Config) {
			if c.NRI.Disable || c.NRI.SocketPath != "/tmp/n.sock" || c.NRI.PluginRequestTimeout != Duration(500*time.Millisecond) || c.NRI.PluginRegistrationTimeout != Duration(time.Minute) || c.NRI.PluginPath != "/opt/nri/plugins" {
				t.Errorf("nri = %+v", c.NRI)
			}
		}},
		{name: "nri bad duration", file: "[nri]\nplugin_request_timeout = \"2\"\n", wantErr: "missing unit"},
		{name: "nri zero timeout", file: "[nri]\ndisable = false\nplugin_request_timeout = \"0s\"\n", wantErr: "nri.plugin_request_timeout must be positive"},
		{name: "nri relative socket", file: "[nri]\ndisable = false\nsocket_path = \"nri.sock\"\n", wantErr: "nri.socket_path: \"nri.sock\" must be an absolute path"},
		{name: "nri no socket without disable_connections", file: "[nri]\ndisable = false\nsocket_path = \"\"\n", wantErr: "nri.socket_path must be set"},
		{name: "nri only pre-registered plugins", file: "[nri]\ndisable = false\nsocket_path = \"\"\ndisable_connections = true\n", check: func(t *testing.T, c Config) {
			if !c.NRI.DisableConnections {
				t.Errorf("nri.disable_connections = false")
			}
		}},
		{name: "nri unknown key", file: "[nri]\nplugin_dir = \"/x\"\n", wantErr: "unknown key"},
		{name: "cni timeout zero", file: "[cni]\ntimeout_seconds = 0\n", wantErr: "cni.timeout_seconds must be positive"},
		{name: "cni masquerade default", file: "", check: func(t *testing.T, c Config) {
			if c.CNI.Masquerade != "runtime" {
				t.Errorf("cni.masquerade = %q, want runtime", c.CNI.Masquerade)
			}
		}},
		{name: "cni masquerade plugin", file: "[cni]\nmasquerade = \"plugin\"\n", check: func(t *testing.T, c Config) {
			if c.CNI.Masquerade != "plugin" {
				t.Errorf("cni.masquerade = %q, want plugin", c.CNI.Masquerade)
			}
		}},
		{name: "cni masquerade unknown", file: "[cni]\nmasquerade = \"both\"\n", wantErr: `cni.masquerade must be "runtime" or "plugin", got "both"`},
		{name: "cni timeout overflowing", file: "[cni]\ntimeout_seconds = 9223372036854775807\n", wantErr: "cni.timeout_seconds must be positive and at most"},
		{name: "shim start timeout beyond a week", file: "shim_start_timeout_seconds = 604801\n", wantErr: "shim_start_timeout_seconds must be positive and at most 604800"},
		{name: "mirrors", file: "[registry]\ninsecure = [\"reg:5000\"]\n[registry.mirrors]\n\"docker.io\" = [\"http://127.0.0.1:5001\"]\n", check: func(t *testing.T, c Config) {
			if c.Registry.Mirrors["docker.io"][0] != "http://127.0.0.1:5001" || c.Registry.Insecure[0] != "reg:5000" || c.Registry.MaxConcurrentDownloads != 3 {
				t.Errorf("registry = %+v", c.Registry)
			}
		}},
		{name: "bad mirror", file: "[registry.mirrors]\n\"docker.io\" = [\"mirror.example\"]\n", wantErr: "must start with http"},
		{name: "syntax", file: "socket = \n", wantErr: "parse config"},
		{name: "image reserve defaults", file: "", check: func(t *testing.T, c Config) {
			if c.Image.MinFreeBytes != 512<<20 || c.Image.MinFreePercent != 5 {
				t.Errorf("image = %+v", c.Image)
			}
		}},
		{name: "image reserve set", file: "[image]\nmin_free_bytes = 1048576\nmin_free_percent = 2.5\n", check: func(t *testing.T, c Config) {
			if c.Image.MinFreeBytes != 1<<20 || c.Image.MinFreePercent != 2.5 {
				t.Errorf("image = %+v", c.Image)
			}
		}},
		{name: "image reserve integer percent and off", file: "[image]\nmin_free_bytes = 0\nmin_free_percent = 10\n", check: func(t *testing.T, c Config) {
			if c.Image.MinFreeBytes != 0 || c.Image.MinFreePercent != 10 {
				t.Errorf("image = %+v", c.Image)
			}
		}},
		{name: "negative min_free_bytes", file: "[image]\nmin_free_bytes = -1\n", wantErr: "image.min_free_bytes must be 0"},
		{name: "percent too large", file: "[image]\nmin_free_percent = 100\n", wantErr: "image.min_free_percent must be"},
		{name: "negative percent", file: "[image]\nmin_free_percent = -5\n", wantErr: "image.min_free_percent must be"},
		{name: "percent nan", file: "[image]\nmin_free_percent = nan\n", wantErr: "image.min_free_percent must be"},
		{name: "metrics off by default", file: "", check: func(t *testing.T, c Config) {
			if c.Metrics.Address != "" {
				t.Errorf("metrics.address = %q, want empty", c.Metrics.Address)
			}
		}},
		{name: "metrics address", file: "[metrics]\naddress = \"127.0.0.1:9942\"\n", check: func(t *testing.T, c Config) {
			if c.Metrics.Address != "127.0.0.1:9942" {
				t.Errorf("metrics.address = %q", c.Metrics.Address)
			}
		}},
		{name: "metrics address ipv6 any port", file: "[metrics]\naddress = \"[::1]:0\"\n", check: func(t *testing.T, c Config) {
			if c.Metrics.Address != "[::1]:0" {
				t.Errorf("metrics.address = %q", c.Metrics.Address)
			}
		}},
		{name: "metrics address without port", file: "[metrics]\naddress = \"127.0.0.1\"\n", wantErr: "metrics.address must be host:port"},
		{name: "metrics address bad port", file: "[metrics]\naddress = \"127.0.0.1:99999\"\n", wantErr: "metrics.address: port must be 0 to 65535"},
		{name: "metrics address named port", file: "[metrics]\naddress = \":http\"\n", wantErr: "metrics.address: port must be"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.toml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

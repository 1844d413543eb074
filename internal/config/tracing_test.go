package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTracingConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*TracingConfig)
		want    TracingTarget
		wantErr string
	}{
		{name: "grpc default", edit: func(*TracingConfig) {}, want: TracingTarget{HostPort: "127.0.0.1:4317"}},
		{name: "http default", edit: func(c *TracingConfig) { c.Protocol = TracingProtocolHTTP }, want: TracingTarget{HostPort: "127.0.0.1:4318"}},
		{name: "host port", edit: func(c *TracingConfig) { c.Endpoint = "otel.example:4317"; c.Insecure = true }, want: TracingTarget{HostPort: "otel.example:4317", Insecure: true}},
		{name: "http url is insecure", edit: func(c *TracingConfig) { c.Endpoint = "http://[::1]:4317" }, want: TracingTarget{HostPort: "[::1]:4317", Insecure: true}},
		{name: "https url with path", edit: func(c *TracingConfig) {
			c.Protocol, c.Endpoint = TracingProtocolHTTP, "https://otel.example:443/otlp/v1/traces"
		}, want: TracingTarget{HostPort: "otel.example:443", Path: "/otlp/v1/traces"}},
		{name: "grpc url with path", edit: func(c *TracingConfig) { c.Endpoint = "https://otel.example:4317/x" }, wantErr: "a grpc endpoint has no path"},
		{name: "no port", edit: func(c *TracingConfig) { c.Endpoint = "otel.example" }, wantErr: "must be host:port"},
		{name: "bad port", edit: func(c *TracingConfig) { c.Endpoint = "otel.example:0" }, wantErr: "port must be 1 to 65535"},
		{name: "bad scheme", edit: func(c *TracingConfig) { c.Endpoint = "ftp://otel.example:21" }, wantErr: "scheme must be http or https"},
		{name: "user info", edit: func(c *TracingConfig) { c.Endpoint = "https://u:p@otel.example:443" }, wantErr: "only scheme, host, port and path"},
		{name: "bad protocol", edit: func(c *TracingConfig) { c.Protocol = "http/json" }, wantErr: `tracing.protocol must be "grpc" or "http/protobuf"`},
		{name: "ratio above one", edit: func(c *TracingConfig) { c.SamplingRatio = 1.5 }, wantErr: "tracing.sampling_ratio must be between 0 and 1"},
		{name: "ratio negative", edit: func(c *TracingConfig) { c.SamplingRatio = -0.1 }, wantErr: "tracing.sampling_ratio"},
		{name: "no service name", edit: func(c *TracingConfig) { c.ServiceName = "" }, wantErr: "tracing.service_name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			tc.edit(&cfg.Tracing)
			err := cfg.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate(): %v", err)
			}
			got, err := cfg.Tracing.Target()
			if err != nil || got != tc.want {
				t.Fatalf("Target() = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestTracingConfigFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "crisp.toml")
	if err := os.WriteFile(path, []byte("[tracing]\nenable = true\nendpoint = \"127.0.0.1:14317\"\ninsecure = true\nsampling_ratio = 0.25\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := TracingConfig{Enable: true, Endpoint: "127.0.0.1:14317", Protocol: TracingProtocolGRPC, Insecure: true, SamplingRatio: 0.25, ServiceName: "crisp"}
	if cfg.Tracing != want {
		t.Fatalf("tracing = %+v, want %+v", cfg.Tracing, want)
	}
	if Reloadable("tracing.enable") {
		t.Error("tracing.enable is reloadable; the provider is built at start")
	}
}

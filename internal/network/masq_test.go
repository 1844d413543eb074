package network

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

func TestPlanMasquerade(t *testing.T) {
	defaultConf, err := defaultConfList(Config{DefaultBridge: "crisp0", DefaultSubnet: "10.88.0.0/16,fd00:88::/64", IPAMDataDir: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	bridge := func(extra string) string {
		return `{"type":"bridge","bridge":"cni0","isGateway":true` + extra + `}`
	}
	list := func(plugins ...string) string {
		return `{"cniVersion":"1.0.0","name":"net","plugins":[` + strings.Join(plugins, ",") + `]}`
	}
	cases := []struct {
		name    string
		conf    string
		subnets string // joined; "" means crisp does not take over
		masqOff []int  // plugins whose ipMasq crisp turns off
		kept    string // substring of the reason a plugin keeps ipMasq
	}{
		{name: "ranges v4", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/16"}]]}`)),
			subnets: "10.1.0.0/16", masqOff: []int{0}},
		{name: "ranges v6", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"fd00:1::/64"}]]}`)),
			subnets: "fd00:1::/64", masqOff: []int{0}},
		{name: "dual stack", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.5/16"}],[{"subnet":"fd00:1::/64"}]]}`)),
			subnets: "10.1.0.0/16,fd00:1::/64", masqOff: []int{0}},
		{name: "two ranges in one set", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/24"},{"subnet":"10.1.1.0/24"}]]}`)),
			subnets: "10.1.0.0/24,10.1.1.0/24", masqOff: []int{0}},
		{name: "legacy subnet", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"host-local","subnet":"10.2.0.0/24","gateway":"10.2.0.1"}`)),
			subnets: "10.2.0.0/24", masqOff: []int{0}},
		{name: "no ipMasq", conf: list(bridge(`,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/16"}]]}`))},
		{name: "ipMasq false", conf: list(bridge(`,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/16"}]]}`))},
		{name: "dhcp", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"dhcp"}`)), kept: `IPAM "dhcp" is not host-local`},
		{name: "host-local without subnets", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"host-local"}`)), kept: "neither ranges nor subnet"},
		{name: "bad subnet", conf: list(bridge(`,"ipMasq":true,"ipam":{"type":"host-local","subnet":"10.2.0.0"}`)), kept: `host-local subnet "10.2.0.0"`},
		{name: "ptp is not bridge", conf: list(`{"type":"ptp","ipMasq":true,"ipam":{"type":"host-local","subnet":"10.3.0.0/24"}}`)},
		{name: "multiple plugins", conf: list(
			`{"type":"tuning","sysctl":{"net.core.somaxconn":"500"}}`,
			bridge(`,"ipMasq":true,"mtu":9000,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.4.0.0/16"}]]}`),
			bridge(`,"ipMasq":true,"ipam":{"type":"static"}`),
			`{"type":"portmap","capabilities":{"portMappings":true},"snat":true}`),
			subnets: "10.4.0.0/16", masqOff: []int{1}, kept: `plugin 2 (bridge): IPAM "static"`},
		{name: "crisp default", conf: string(defaultConf), subnets: "10.88.0.0/16,fd00:88::/64", masqOff: []int{0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			orig, err := libcni.NetworkConfFromBytes([]byte(c.conf))
			if err != nil {
				t.Fatal(err)
			}
			origBytes := bytes.Clone(orig.Bytes)
			plan, err := planMasquerade(orig)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(orig.Bytes, origBytes) {
				t.Error("the loaded config was changed")
			}
			if got := joinCIDRs(plan.subnets); got != c.subnets {
				t.Errorf("subnets = %q, want %q", got, c.subnets)
			}
			if got := strings.Join(plan.kept, "; "); (c.kept == "") != (got == "") || !strings.Contains(got, c.kept) {
				t.Errorf("kept = %q, want it to say %q", got, c.kept)
			}
			if c.subnets == "" {
				if plan.list != orig {
					t.Error("config copied though crisp takes nothing over")
				}
				return
			}
			// What libcni caches for DEL says the same as what ADD runs with.
			cached, err := libcni.NetworkConfFromBytes(plan.list.Bytes)
			if err != nil {
				t.Fatalf("cached bytes: %v", err)
			}
			if got := joinCIDRs(cachedMasqSubnets(plan.list.Bytes)); got != c.subnets {
				t.Errorf("cached subnets = %q, want %q", got, c.subnets)
			}
			if cachedMasqSubnets(orig.Bytes) != nil {
				t.Error("original config says crisp masquerades")
			}
			if len(plan.list.Plugins) != len(orig.Plugins) || len(cached.Plugins) != len(orig.Plugins) {
				t.Fatalf("%d plugins (%d cached), want %d", len(plan.list.Plugins), len(cached.Plugins), len(orig.Plugins))
			}
			for i := range orig.Plugins {
				off := false
				for _, j := range c.masqOff {
					off = off || i == j
				}
				for _, l := range []*libcni.NetworkConfigList{plan.list, cached} {
					if got, want := ipMasqOn(l.Plugins[i].Bytes), ipMasqOn(orig.Plugins[i].Bytes) && !off; got != want {
						t.Errorf("plugin %d ipMasq = %v, want %v", i, got, want)
					}
					// Everything else of the plugin is as the operator wrote it.
					if !sameExcept(t, l.Plugins[i].Bytes, orig.Plugins[i].Bytes, "ipMasq") {
						t.Errorf("plugin %d changed beyond ipMasq:\n%s\nwas\n%s", i, l.Plugins[i].Bytes, orig.Plugins[i].Bytes)
					}
				}
			}
			if plan.list.Name != orig.Name || plan.list.CNIVersion != orig.CNIVersion {
				t.Errorf("list %s/%s, want %s/%s", plan.list.Name, plan.list.CNIVersion, orig.Name, orig.CNIVersion)
			}
		})
	}
}

// sameExcept reports whether two JSON objects are equal but for key.
func sameExcept(t *testing.T, a, b []byte, key string) bool {
	t.Helper()
	var ma, mb map[string]any
	if err := json.Unmarshal(a, &ma); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &mb); err != nil {
		t.Fatal(err)
	}
	delete(ma, key)
	delete(mb, key)
	ja, _ := json.Marshal(ma)
	jb, _ := json.Marshal(mb)
	return bytes.Equal(ja, jb)
}

func TestCachedMasqSubnets(t *testing.T) {
	for conf, want := range map[string]string{
		`{"name":"n","crispMasquerade":["10.1.0.0/16","fd00::/64"]}`: "10.1.0.0/16,fd00::/64",
		`{"name":"n"}`: "",
		`{"name":"n","crispMasquerade":"10.1.0.0/16"}`: "",
		`not json`: "",
	} {
		if got := joinCIDRs(cachedMasqSubnets([]byte(conf))); got != want {
			t.Errorf("cachedMasqSubnets(%s) = %q, want %q", conf, got, want)
		}
	}
}

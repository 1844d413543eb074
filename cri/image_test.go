package cri

import "testing"

func TestImageUser(t *testing.T) {
	cases := []struct {
		in   string
		uid  int64
		name string
		nil_ bool
	}{
		{"", 0, "", true},
		{"1000", 1000, "", false},
		{"0:0", 0, "", false},
		{"app", 0, "app", true},
		{"app:grp", 0, "app", true},
	}
	for _, tc := range cases {
		uid, name := imageUser(tc.in)
		if (uid == nil) != tc.nil_ || (uid != nil && *uid != tc.uid) || name != tc.name {
			t.Errorf("imageUser(%q) = %v, %q", tc.in, uid, name)
		}
	}
}

package spec

import (
	"os"
	"path/filepath"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func i64(v int64) *runtime.Int64Value { return &runtime.Int64Value{Value: v} }

func TestUser(t *testing.T) {
	setHost(t, defaultHost())
	for _, tc := range []struct {
		name          string
		imageUser     string
		runAsUser     *runtime.Int64Value
		runAsUsername string
		runAsGroup    *runtime.Int64Value
		supplemental  []int64
		strict        bool
		passwd, group string // "" = the test files; "-" = none
		want          UserInfo
		wantErr       string
		notFound      bool
	}{
		{name: "default is root with root's groups", want: UserInfo{0, 0, []uint32{0, 10}}},
		{name: "image uid in passwd", imageUser: "1000", want: UserInfo{1000, 1000, []uint32{44, 100, 1000}}},
		{name: "image uid not in passwd gets gid 0", imageUser: "4242", want: UserInfo{4242, 0, []uint32{0}}},
		{name: "image name", imageUser: "bob", want: UserInfo{1001, 100, []uint32{29, 44, 100}}},
		{name: "image uid:gid", imageUser: "1000:5", want: UserInfo{1000, 5, []uint32{5, 44, 100}}},
		{name: "image name:group", imageUser: "alice:video", want: UserInfo{1000, 44, []uint32{44, 100}}},
		{name: "image uid:group", imageUser: "4242:audio", want: UserInfo{4242, 29, []uint32{29}}},
		{name: "image name:gid", imageUser: "alice:7", want: UserInfo{1000, 7, []uint32{7, 44, 100}}},
		{name: "run_as_user overrides image user and its group", imageUser: "bob:audio", runAsUser: i64(1000), want: UserInfo{1000, 1000, []uint32{44, 100, 1000}}},
		{name: "run_as_username wins over run_as_user", runAsUsername: "bob", runAsUser: i64(1000), want: UserInfo{1001, 100, []uint32{29, 44, 100}}},
		{name: "run_as_user and run_as_group", runAsUser: i64(1001), runAsGroup: i64(3000), want: UserInfo{1001, 3000, []uint32{29, 44, 3000}}},
		{name: "run_as_username and run_as_group", runAsUsername: "alice", runAsGroup: i64(3000), want: UserInfo{1000, 3000, []uint32{44, 100, 3000}}},
		{name: "run_as_group without a user", runAsGroup: i64(3000), wantErr: "run_as_group 3000 is set without run_as_user or run_as_username"},
		{name: "run_as_group with only the image's user", imageUser: "alice:video", runAsGroup: i64(3000), wantErr: "run_as_group 3000 is set without run_as_user or run_as_username"},
		{name: "merge adds supplemental groups", imageUser: "alice", supplemental: []int64{2000, 44}, want: UserInfo{1000, 1000, []uint32{44, 100, 1000, 2000}}},
		{name: "strict keeps only explicit groups", imageUser: "alice", supplemental: []int64{2000}, strict: true, want: UserInfo{1000, 1000, []uint32{1000, 2000}}},
		{name: "strict without groups", imageUser: "bob", strict: true, want: UserInfo{1001, 100, []uint32{100}}},
		{name: "no passwd: uid works", imageUser: "1000", passwd: "-", group: "-", want: UserInfo{1000, 0, []uint32{0}}},
		{name: "no passwd: uid:gid works", imageUser: "1000:1000", passwd: "-", group: "-", want: UserInfo{1000, 1000, []uint32{1000}}},
		{name: "unknown image user", imageUser: "nobody2", wantErr: `user "nobody2" (the image's USER) not found in the image's /etc/passwd`, notFound: true},
		{name: "unknown run_as_username", runAsUsername: "ghost", wantErr: `user "ghost" (run_as_username) not found in the image's /etc/passwd`, notFound: true},
		{name: "name without passwd", imageUser: "alice", passwd: "-", wantErr: `user "alice" (the image's USER) not found: the image has no /etc/passwd`, notFound: true},
		{name: "unknown group", imageUser: "alice:staff", wantErr: `group "staff" (the image's USER) not found in the image's /etc/group`, notFound: true},
		{name: "group without group file", imageUser: "1000:staff", group: "-", wantErr: `group "staff" (the image's USER) not found: the image has no /etc/group`, notFound: true},
		{name: "too many colons", imageUser: "a:b:c", wantErr: `USER "a:b:c" is not of the form`},
		{name: "empty group part", imageUser: "alice:", wantErr: `USER "alice:" is not of the form`},
		{name: "negative run_as_user", runAsUser: i64(-1), wantErr: "run_as_user -1 is out of range"},
		{name: "uid too big", imageUser: "4294967296", wantErr: "uid 4294967296 is out of range"},
		{name: "negative supplemental group", supplemental: []int64{-5}, wantErr: "supplemental group -5 is out of range"},
		{name: "colon in run_as_username", runAsUsername: "a:b", wantErr: `run_as_username "a:b" must be a user name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			passwd, group := testPasswd, testGroup
			if tc.passwd == "-" {
				passwd = ""
			}
			if tc.group == "-" {
				group = ""
			}
			in := baseInput(t)
			in.RootfsPath = writeRootfs(t, passwd, group)
			in.Image.Config.User = tc.imageUser
			s := sc(in)
			s.RunAsUser, s.RunAsUsername, s.RunAsGroup, s.SupplementalGroups = tc.runAsUser, tc.runAsUsername, tc.runAsGroup, tc.supplemental
			if tc.strict {
				s.SupplementalGroupsPolicy = runtime.SupplementalGroupsPolicy_Strict
			}
			if tc.wantErr != "" {
				_, err := Generate(in)
				is := isInvalid
				if tc.notFound {
					is = isNotFound
				}
				wantErr(t, err, is, tc.wantErr)
				return
			}
			res := mustGenerate(t, in)
			equal(t, "user", res.User, tc.want)
			u := res.Spec.Process.User
			equal(t, "spec user", UserInfo{u.UID, u.GID, u.AdditionalGids}, tc.want)
		})
	}
}

// TestUserFilesAreReadInsideTheRootfs: an image whose /etc/passwd and /etc/group are
// symlinks leading out of the rootfs must not make crisp read the host's files; the
// links resolve inside the rootfs, as they would in the container.
func TestUserFilesAreReadInsideTheRootfs(t *testing.T) {
	setHost(t, defaultHost())
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	hostPasswd := "evil:x:4242:4242::/:/bin/sh\nroot:x:0:4242::/:/bin/sh\n"
	if err := os.WriteFile(filepath.Join(outside, "passwd"), []byte(hostPasswd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "group"), []byte("evilgroup:x:4343:root,evil\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(base, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, link := range []struct{ name, target string }{
		{"passwd", filepath.Join(outside, "passwd")}, // absolute, out of the rootfs
		{"group", "../../outside/group"},             // relative, climbing out
	} {
		if err := os.Symlink(link.target, filepath.Join(rootfs, "etc", link.name)); err != nil {
			t.Fatal(err)
		}
	}

	in := baseInput(t)
	in.RootfsPath = rootfs
	in.Image.Config.User = "evil"
	_, err := Generate(in)
	wantErr(t, err, isNotFound, `user "evil" (the image's USER) not found: the image has no /etc/passwd`)

	in.Image.Config.User = "0"
	res := mustGenerate(t, in)
	equal(t, "user", res.User, UserInfo{0, 0, []uint32{0}})

	in.Image.Config.User = "0:evilgroup"
	_, err = Generate(in)
	wantErr(t, err, isNotFound, `group "evilgroup"`)

	// A link that stays inside the rootfs is followed, even when absolute.
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "passwd.real"), []byte(testPasswd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(rootfs, "etc", "passwd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd.real", filepath.Join(rootfs, "etc", "passwd")); err != nil {
		t.Fatal(err)
	}
	in.Image.Config.User = "alice"
	equal(t, "uid", mustGenerate(t, in).User.UID, uint32(1000))
}

func TestUserFileNotRegular(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	in.RootfsPath = writeRootfs(t, "", testGroup)
	if err := os.Mkdir(filepath.Join(in.RootfsPath, "etc", "passwd"), 0o755); err != nil {
		t.Fatal(err)
	}
	in.Image.Config.User = "alice"
	_, err := Generate(in)
	wantErr(t, err, isInvalid, "/etc/passwd is not a regular file")
}

func TestRootfsRequired(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	in.RootfsPath = ""
	_, err := Generate(in)
	wantErr(t, err, isInvalid, "rootfs path")
	in.RootfsPath = filepath.Join(t.TempDir(), "missing")
	_, err = Generate(in)
	wantErr(t, err, isInvalid, "is not a readable directory")
}

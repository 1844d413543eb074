package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	"github.com/moby/sys/user"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxID is the largest uid/gid accepted: runc needs ids to fit an int32 and containerd
// follows it (oci.WithUser).
const maxID = math.MaxInt32

// maxUserFileBytes bounds how much of an image's /etc/passwd or /etc/group is read
// (containerd uses the same 10 MiB cap): the file is untrusted image content.
const maxUserFileBytes = 10 << 20

// UserInfo is the identity the container's first process runs as; it is what
// ContainerStatus reports as user.linux (uid, gid, supplemental_groups).
type UserInfo struct {
	UID, GID uint32
	// AdditionalGIDs are sorted and include GID, as containerd reports them.
	AdditionalGIDs []uint32
}

// userDB reads the image's /etc/passwd and /etc/group at most once per Generate.
type userDB struct {
	rootfs string

	passwdRead bool
	passwd     []user.User // nil with passwdRead: the image has no /etc/passwd
	passwdOK   bool
	groupRead  bool
	groups     []user.Group
	groupOK    bool
}

func (db *userDB) users() ([]user.User, bool, error) {
	if !db.passwdRead {
		b, ok, err := readImageFile(db.rootfs, "etc/passwd")
		if err != nil {
			return nil, false, err
		}
		if ok {
			if db.passwd, err = user.ParsePasswd(bytes.NewReader(b)); err != nil {
				return nil, false, invalidf("the image's /etc/passwd cannot be parsed: %v", err)
			}
		}
		db.passwdRead, db.passwdOK = true, ok
	}
	return db.passwd, db.passwdOK, nil
}

func (db *userDB) groupList() ([]user.Group, bool, error) {
	if !db.groupRead {
		b, ok, err := readImageFile(db.rootfs, "etc/group")
		if err != nil {
			return nil, false, err
		}
		if ok {
			if db.groups, err = user.ParseGroup(bytes.NewReader(b)); err != nil {
				return nil, false, invalidf("the image's /etc/group cannot be parsed: %v", err)
			}
		}
		db.groupRead, db.groupOK = true, ok
	}
	return db.groups, db.groupOK, nil
}

// readImageFile reads rootfs/name as the container would see it: every symlink on the
// way is resolved inside rootfs (an absolute or ../ link that points "outside" lands
// inside the rootfs, as it would after pivot_root), so a hostile image can never make
// crisp read a host file. ok is false when the file does not exist in the image. Only a
// regular file is read (a FIFO or device could block or never end), and at most
// maxUserFileBytes of it.
func readImageFile(rootfs, name string) (_ []byte, ok bool, _ error) {
	handle, err := pathrs.OpenInRoot(rootfs, name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return nil, false, nil
		}
		return nil, false, invalidf("the image's /%s cannot be opened: %v", name, err)
	}
	defer handle.Close()
	st, err := handle.Stat()
	if err != nil {
		return nil, false, fmt.Errorf("stat the image's /%s: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return nil, false, invalidf("the image's /%s is not a regular file (%s)", name, st.Mode().Type())
	}
	f, err := pathrs.Reopen(handle, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, false, fmt.Errorf("open the image's /%s: %w", name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxUserFileBytes+1))
	if err != nil {
		return nil, false, fmt.Errorf("read the image's /%s: %w", name, err)
	}
	if len(b) > maxUserFileBytes {
		return nil, false, invalidf("the image's /%s is larger than %d bytes", name, maxUserFileBytes)
	}
	return b, true, nil
}

// userRequest is the user and group a container asked for, before resolution.
type userRequest struct {
	user  string // uid or name; never empty
	group string // gid, name or "" (take the user's passwd entry, else 0)
	from  string // where the request came from, for error messages
}

// requestedUser picks the user the way kubelet expects and containerd does:
// run_as_username, else run_as_user, else the image's USER, else root. run_as_group
// sets the group. With a CRI user, the image's group is ignored (containerd).
// run_as_group needs run_as_user or run_as_username: containerd and CRI-O refuse it
// alone (the group would otherwise silently pair with whatever user the image names).
func requestedUser(sc *runtime.LinuxContainerSecurityContext, imageUser string) (userRequest, error) {
	var r userRequest
	if g := sc.GetRunAsGroup(); g != nil && sc.GetRunAsUser() == nil && sc.GetRunAsUsername() == "" {
		return r, invalidf("run_as_group %d is set without run_as_user or run_as_username: set the user too (runAsUser in the pod or container securityContext)", g.GetValue())
	}
	switch {
	case sc.GetRunAsUsername() != "":
		if strings.Contains(sc.GetRunAsUsername(), ":") {
			return r, invalidf("run_as_username %q must be a user name, without ':'", sc.GetRunAsUsername())
		}
		r = userRequest{user: sc.GetRunAsUsername(), from: "run_as_username"}
	case sc.GetRunAsUser() != nil:
		v := sc.GetRunAsUser().GetValue()
		if v < 0 || v > maxID {
			return r, invalidf("run_as_user %d is out of range (0 to %d)", v, maxID)
		}
		r = userRequest{user: strconv.FormatInt(v, 10), from: "run_as_user"}
	case imageUser != "":
		parts := strings.Split(imageUser, ":")
		if len(parts) > 2 || parts[0] == "" || (len(parts) == 2 && parts[1] == "") {
			return r, invalidf("the image's USER %q is not of the form user, uid, user:group or uid:gid", imageUser)
		}
		r = userRequest{user: parts[0], from: "the image's USER"}
		if len(parts) == 2 {
			r.group = parts[1]
		}
	default:
		r = userRequest{user: "0", from: "default"}
	}
	if g := sc.GetRunAsGroup(); g != nil {
		if g.GetValue() < 0 || g.GetValue() > maxID {
			return r, invalidf("run_as_group %d is out of range (0 to %d)", g.GetValue(), maxID)
		}
		r.group = strconv.FormatInt(g.GetValue(), 10)
	}
	return r, nil
}

// parseID returns the numeric id in s, ok=false when s is a name. Only plain digits are
// numeric ("+5" and "-1" are names, which then fail the lookup); a number too big for
// an id is an error.
func parseID(s, what string) (uint32, bool, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > maxID {
		return 0, false, invalidf("%s %s is out of range (0 to %d)", what, s, maxID)
	}
	return uint32(v), true, nil
}

// resolveUser turns the request into uid and gid against the image's own files, as
// containerd's oci.WithUser does: a uid not in /etc/passwd (or no /etc/passwd) is
// fine and gets gid 0 unless a group was given; a name must exist.
func resolveUser(db *userDB, r userRequest) (uid, gid uint32, err error) {
	uid, numeric, err := parseID(r.user, "uid")
	if err != nil {
		return 0, 0, err
	}
	var entry *user.User
	if numeric {
		if r.group == "" {
			users, _, err := db.users()
			if err != nil {
				return 0, 0, err
			}
			if i := slices.IndexFunc(users, func(u user.User) bool { return u.Uid == int(uid) }); i >= 0 {
				entry = &users[i]
			}
		}
	} else {
		users, ok, err := db.users()
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			return 0, 0, notFoundf("user %q (%s) not found: the image has no /etc/passwd", r.user, r.from)
		}
		i := slices.IndexFunc(users, func(u user.User) bool { return u.Name == r.user })
		if i < 0 {
			return 0, 0, notFoundf("user %q (%s) not found in the image's /etc/passwd", r.user, r.from)
		}
		entry = &users[i]
		if entry.Uid < 0 || entry.Uid > maxID || entry.Gid < 0 || entry.Gid > maxID {
			return 0, 0, invalidf("user %q in the image's /etc/passwd has an out-of-range uid or gid", r.user)
		}
		uid = uint32(entry.Uid)
	}
	if entry != nil {
		gid = uint32(entry.Gid)
	}
	if r.group != "" {
		g, numeric, err := parseID(r.group, "gid")
		if err != nil {
			return 0, 0, err
		}
		if !numeric {
			groups, ok, err := db.groupList()
			if err != nil {
				return 0, 0, err
			}
			if !ok {
				return 0, 0, notFoundf("group %q (%s) not found: the image has no /etc/group", r.group, r.from)
			}
			i := slices.IndexFunc(groups, func(gr user.Group) bool { return gr.Name == r.group })
			if i < 0 {
				return 0, 0, notFoundf("group %q (%s) not found in the image's /etc/group", r.group, r.from)
			}
			if groups[i].Gid < 0 || groups[i].Gid > maxID {
				return 0, 0, invalidf("group %q in the image's /etc/group has an out-of-range gid", r.group)
			}
			g = uint32(groups[i].Gid)
		}
		gid = g
	}
	return uid, gid, nil
}

// imageGroups returns the gids of the groups in the image's /etc/group that list the
// user as a member (containerd's oci.WithAdditionalGIDs): the user is looked up by name,
// or for a uid by its passwd entry's name; a uid without an entry has none. A group named
// like the user is left out, as containerd does (it is the user's primary group).
func imageGroups(db *userDB, r userRequest, uid uint32) ([]uint32, error) {
	name := r.user
	if _, numeric, _ := parseID(r.user, "uid"); numeric {
		users, _, err := db.users()
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(users, func(u user.User) bool { return u.Uid == int(uid) })
		if i < 0 {
			return nil, nil
		}
		name = users[i].Name
	}
	groups, _, err := db.groupList()
	if err != nil {
		return nil, err
	}
	var gids []uint32
	for _, g := range groups {
		if g.Name != name && slices.Contains(g.List, name) && g.Gid >= 0 && g.Gid <= maxID {
			gids = append(gids, uint32(g.Gid))
		}
	}
	return gids, nil
}

// resolveIdentity computes the process user: uid, gid and the supplemental groups.
// SupplementalGroupsPolicy Merge (the default) adds the image's groups of the user to
// the CRI's supplemental_groups (which kubelet fills with fsGroup and the pod's
// supplementalGroups); Strict uses only the CRI's. The primary gid is always included,
// as containerd does, so ContainerStatus reports the full set (KEP-3619).
func resolveIdentity(rootfs string, sc *runtime.LinuxContainerSecurityContext, imageUser string) (UserInfo, error) {
	if rootfs == "" || !filepath.IsAbs(rootfs) {
		return UserInfo{}, invalidf("rootfs path %q must be an absolute path to the mounted rootfs", rootfs)
	}
	if st, err := os.Stat(rootfs); err != nil || !st.IsDir() {
		return UserInfo{}, invalidf("rootfs path %q is not a readable directory", rootfs)
	}
	r, err := requestedUser(sc, imageUser)
	if err != nil {
		return UserInfo{}, err
	}
	db := &userDB{rootfs: rootfs}
	uid, gid, err := resolveUser(db, r)
	if err != nil {
		return UserInfo{}, err
	}
	gids := []uint32{gid}
	switch p := sc.GetSupplementalGroupsPolicy(); p {
	case runtime.SupplementalGroupsPolicy_Merge:
		more, err := imageGroups(db, r, uid)
		if err != nil {
			return UserInfo{}, err
		}
		gids = append(gids, more...)
	case runtime.SupplementalGroupsPolicy_Strict:
	default:
		return UserInfo{}, invalidf("supplemental_groups_policy %d is not Merge or Strict", p)
	}
	for _, g := range sc.GetSupplementalGroups() {
		if g < 0 || g > maxID {
			return UserInfo{}, invalidf("supplemental group %d is out of range (0 to %d)", g, maxID)
		}
		gids = append(gids, uint32(g))
	}
	slices.Sort(gids)
	return UserInfo{UID: uid, GID: gid, AdditionalGIDs: slices.Compact(gids)}, nil
}

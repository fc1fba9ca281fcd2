package bench

import (
	"fmt"
	"os"
	"syscall"
)

// fsMagic names the filesystem types of statfs(2) that a data directory is
// likely to be on.
var fsMagic = map[int64]string{
	0xef53:     "ext2/3/4",
	0x58465342: "xfs",
	0x9123683e: "btrfs",
	0x01021994: "tmpfs",
	0x794c7630: "overlayfs",
	0x2fc12fc1: "zfs",
	0x6969:     "nfs",
	0xf2f52010: "f2fs",
	0x65735546: "fuse",
	0x858458f6: "ramfs",
}

// fsType names the filesystem dir is on (statfs f_type).
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	if name, ok := fsMagic[int64(st.Type)]; ok {
		return fmt.Sprintf("%s (statfs type %#x)", name, st.Type)
	}
	return fmt.Sprintf("statfs type %#x", st.Type)
}

// fdatasync flushes f's data (and the metadata needed to read it back).
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

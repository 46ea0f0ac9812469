/*
 * faultfs: a FUSE passthrough file system that injects one fault, for the state-file fault runs
 * (e2e/state_file_faults_test.py, issue 42). Built by that test with libfuse3 (Debian's
 * libfuse3-dev):
 *
 *     cc -O2 -Wall -o faultfs e2e/faultfs.c $(pkg-config fuse3 --cflags --libs)
 *     faultfs BACKING CONTROL MOUNTPOINT -f [fuse options]
 *
 * Every file operation is passed to the folder BACKING. Before each of the operations a state
 * file's save makes (create, write, fsync, rename, fsyncdir: the temporary file made, written and
 * flushed, renamed over the target, then the folder flushed; StateFile.swift), faultfs reads the
 * file CONTROL, which holds nothing (no fault) or one line:
 *
 *     OP ACTION [MILLISECONDS]
 *
 * OP is create, write, fsync, rename, fsyncdir or any; ACTION is eio or enospc (the operation
 * fails with that error and is not done) or delay (it waits MILLISECONDS, then is done; a
 * caller that is killed meanwhile ends the wait with EINTR). Each
 * injection is printed on standard error as `faultfs: OP ACTION`, so that a run can say which
 * fault it injected at which step and show that the step was reached.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int backing = -1;
static const char *control_path;

/* The path FUSE gives ("/a/b") relative to the backing folder ("a/b", or "." for the root). */
static const char *rel(const char *path) {
    while (*path == '/') path++;
    return *path ? path : ".";
}

/* Reads CONTROL and applies its fault to `op`: 0 to go on, or -errno to fail the operation. */
static int fault(const char *op) {
    FILE *file = fopen(control_path, "r");
    if (!file) return 0;
    char want[32] = "", action[32] = "";
    long milliseconds = 0;
    int fields = fscanf(file, "%31s %31s %ld", want, action, &milliseconds);
    fclose(file);
    if (fields < 2) return 0;
    if (strcmp(want, op) != 0 && strcmp(want, "any") != 0) return 0;
    fprintf(stderr, "faultfs: %s %s\n", op, action);
    if (strcmp(action, "eio") == 0) return -EIO;
    if (strcmp(action, "enospc") == 0) return -ENOSPC;
    if (strcmp(action, "delay") == 0 && milliseconds > 0) {
        struct timespec pause = {milliseconds / 1000, (milliseconds % 1000) * 1000000L};
        /* With config->intr: a caller killed while it waits (a process that exits) interrupts
         * the delay (libfuse signals this thread), as a disk's hang ends for a caller that can be
         * interrupted. Without it the kernel waits for the answer, uninterruptibly: no process
         * can exit while one of its threads waits in a hung disk's D state. */
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
            if (fuse_interrupted()) {
                fprintf(stderr, "faultfs: %s interrupted\n", op);
                return -EINTR;
            }
        }
    }
    return 0;
}

static void *ff_init(struct fuse_conn_info *conn, struct fuse_config *config) {
    (void)conn;
    config->use_ino = 1;
    config->entry_timeout = 0;
    config->attr_timeout = 0;
    config->negative_timeout = 0;
    /* A file renamed over while open is unlinked at once, not hidden as .fuse_hidden*. */
    config->hard_remove = 1;
    /* A caller killed during an injected delay interrupts it (see fault()). */
    config->intr = 1;
    return NULL;
}

static int ff_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    int result = fi ? fstat((int)fi->fh, st) : fstatat(backing, rel(path), st, AT_SYMLINK_NOFOLLOW);
    return result == 0 ? 0 : -errno;
}

static int ff_readlink(const char *path, char *buffer, size_t size) {
    ssize_t length = readlinkat(backing, rel(path), buffer, size - 1);
    if (length < 0) return -errno;
    buffer[length] = 0;
    return 0;
}

static int ff_opendir(const char *path, struct fuse_file_info *fi) {
    int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int ff_readdir(const char *path, void *buffer, fuse_fill_dir_t fill, off_t offset,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)offset, (void)fi, (void)flags;
    int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -errno;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return -errno;
    }
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        struct stat st = {0};
        st.st_ino = entry->d_ino;
        st.st_mode = (mode_t)entry->d_type << 12;
        if (fill(buffer, entry->d_name, &st, 0, 0)) break;
    }
    closedir(dir);
    return 0;
}

static int ff_releasedir(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int ff_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)path;
    int injected = fault("fsyncdir");
    if (injected) return injected;
    int result = datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh);
    return result == 0 ? 0 : -errno;
}

static int ff_mkdir(const char *path, mode_t mode) {
    return mkdirat(backing, rel(path), mode) == 0 ? 0 : -errno;
}

static int ff_unlink(const char *path) {
    return unlinkat(backing, rel(path), 0) == 0 ? 0 : -errno;
}

static int ff_rmdir(const char *path) {
    return unlinkat(backing, rel(path), AT_REMOVEDIR) == 0 ? 0 : -errno;
}

static int ff_symlink(const char *target, const char *path) {
    return symlinkat(target, backing, rel(path)) == 0 ? 0 : -errno;
}

static int ff_rename(const char *from, const char *to, unsigned int flags) {
    if (flags) return -EINVAL;
    int injected = fault("rename");
    if (injected) return injected;
    return renameat(backing, rel(from), backing, rel(to)) == 0 ? 0 : -errno;
}

static int ff_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int result = fi ? fchmod((int)fi->fh, mode) : fchmodat(backing, rel(path), mode, 0);
    return result == 0 ? 0 : -errno;
}

static int ff_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi) {
    int result = fi ? fchown((int)fi->fh, uid, gid) : fchownat(backing, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW);
    return result == 0 ? 0 : -errno;
}

static int ff_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    if (fi) return ftruncate((int)fi->fh, size) == 0 ? 0 : -errno;
    int fd = openat(backing, rel(path), O_WRONLY);
    if (fd < 0) return -errno;
    int result = ftruncate(fd, size) == 0 ? 0 : -errno;
    close(fd);
    return result;
}

static int ff_utimens(const char *path, const struct timespec times[2], struct fuse_file_info *fi) {
    int result = fi ? futimens((int)fi->fh, times) : utimensat(backing, rel(path), times, AT_SYMLINK_NOFOLLOW);
    return result == 0 ? 0 : -errno;
}

static int ff_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int injected = fault("create");
    if (injected) return injected;
    int fd = openat(backing, rel(path), fi->flags | O_NOFOLLOW, mode);
    if (fd < 0) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int ff_open(const char *path, struct fuse_file_info *fi) {
    int fd = openat(backing, rel(path), fi->flags & ~O_CREAT);
    if (fd < 0) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int ff_read(const char *path, char *buffer, size_t size, off_t offset, struct fuse_file_info *fi) {
    (void)path;
    ssize_t count = pread((int)fi->fh, buffer, size, offset);
    return count < 0 ? -errno : (int)count;
}

static int ff_write(const char *path, const char *buffer, size_t size, off_t offset, struct fuse_file_info *fi) {
    (void)path;
    int injected = fault("write");
    if (injected) return injected;
    ssize_t count = pwrite((int)fi->fh, buffer, size, offset);
    return count < 0 ? -errno : (int)count;
}

static int ff_statfs(const char *path, struct statvfs *st) {
    (void)path;
    return fstatvfs(backing, st) == 0 ? 0 : -errno;
}

static int ff_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int ff_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)path;
    int injected = fault("fsync");
    if (injected) return injected;
    int result = datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh);
    return result == 0 ? 0 : -errno;
}

static const struct fuse_operations operations = {
    .init = ff_init,
    .getattr = ff_getattr,
    .readlink = ff_readlink,
    .opendir = ff_opendir,
    .readdir = ff_readdir,
    .releasedir = ff_releasedir,
    .fsyncdir = ff_fsyncdir,
    .mkdir = ff_mkdir,
    .unlink = ff_unlink,
    .rmdir = ff_rmdir,
    .symlink = ff_symlink,
    .rename = ff_rename,
    .chmod = ff_chmod,
    .chown = ff_chown,
    .truncate = ff_truncate,
    .utimens = ff_utimens,
    .create = ff_create,
    .open = ff_open,
    .read = ff_read,
    .write = ff_write,
    .statfs = ff_statfs,
    .release = ff_release,
    .fsync = ff_fsync,
};

/* libfuse interrupts a request's thread with SIGUSR1 (config->intr); set in init(), after
 * libfuse would have installed its own handler, so this one keeps the signal from killing the
 * process: it only ends the sleep in fault() (no SA_RESTART). */
static void on_interrupt(int signal_number) { (void)signal_number; }

int main(int argc, char *argv[]) {
    struct sigaction action = {0};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, NULL);
    if (argc < 4) {
        fprintf(stderr, "usage: %s BACKING CONTROL MOUNTPOINT [fuse options]\n", argv[0]);
        return 64;
    }
    backing = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (backing < 0) {
        perror(argv[1]);
        return 1;
    }
    control_path = argv[2];
    /* fuse_main sees: program, MOUNTPOINT, options. */
    argv[2] = argv[0];
    return fuse_main(argc - 2, argv + 2, &operations, NULL);
}

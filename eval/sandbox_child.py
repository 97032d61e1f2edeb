"""The child side of eval/sandbox.py: set resource limits, install the guard, run ./main.py.

    python -I -B eval/sandbox_child.py '{"cpu_s": 11, "memory_bytes": ..., "file_bytes": ..., "as_main": true}'

Runs in a fresh interpreter whose cwd is the run's temporary directory. Imports only the standard library.
The guard refuses, with PermissionError: opening a file for writing, creating, removing, renaming or
changing permissions outside the cwd; starting processes or shells (os.system, subprocess, fork, exec,
spawn); signalling other processes; leaving the cwd; raising the resource limits; importing ctypes.
It is a guard against accidents and careless code, not a security boundary: the resource limits, the
separate process group and the parent's wall-clock kill are the backstop.
"""
import builtins
import io
import json
import os
import posix
import resource
import sys

REFUSED = ("system", "popen", "fork", "forkpty", "execv", "execve", "execl", "execle", "execlp", "execlpe",
           "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
           "spawnvpe", "posix_spawn", "posix_spawnp", "kill", "killpg", "chdir", "fchdir", "chroot", "setsid",
           "setpgid", "setpgrp")
PATH_CHANGING = ("remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "mkdir", "makedirs",
                 "chmod", "lchmod", "chown", "lchown", "link", "symlink", "truncate", "utime", "mkfifo", "mknod")
BLOCKED_IMPORTS = ("ctypes", "_ctypes", "cffi")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def set_limits(cpu_s: int, memory_bytes: int, file_bytes: int) -> None:
    """CPU seconds (SIGXCPU, then SIGKILL a second later), address space, largest file written, no core."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def refuse(what: str):
    raise PermissionError(f"sandbox: {what} is not allowed")


def install_guard(root: str) -> None:
    """Patch builtins / io / os / posix / subprocess so that the program stays inside `root`."""
    root = os.path.realpath(root)

    def inside(path) -> bool:
        if isinstance(path, int):                  # an already open descriptor (stdout, stdin, ...)
            return True
        full = os.path.realpath(os.path.join(root, os.fsdecode(os.fspath(path))))
        return full == root or full.startswith(root + os.sep)

    def check(*paths, what="writing"):
        for path in paths:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                refuse(f"{what} {path!r} outside the sandbox directory")

    import _posixsubprocess
    import subprocess                              # before os is patched: it imports threading, which needs os
    _patch_open(check)
    _patch_os(check)
    subprocess.Popen = _refusing("subprocess.Popen")
    _posixsubprocess.fork_exec = _refusing("fork_exec")
    resource.setrlimit = _refusing("resource.setrlimit")
    sys.meta_path.insert(0, _ImportBlocker())


def _refusing(name: str):
    def refused(*args, **kwargs):
        refuse(name)
    return refused


def _patch_open(check) -> None:
    """open / io.open / io.FileIO / os.open refuse writing outside the root."""
    original_open, original_os_open, file_io = io.open, os.open, io.FileIO

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax+"):
            check(file)
        return original_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & WRITE_FLAGS:
            if kwargs.get("dir_fd") is not None:
                refuse("os.open with dir_fd for writing")
            check(path)
        return original_os_open(path, flags, *args, **kwargs)

    class GuardedFileIO(file_io):
        def __init__(self, file, mode="r", *args, **kwargs):
            if any(flag in mode for flag in "wax+"):
                check(file)
            super().__init__(file, mode, *args, **kwargs)

    builtins.open = io.open = guarded_open
    io.FileIO = GuardedFileIO
    os.open = posix.open = guarded_os_open


def _patch_os(check) -> None:
    """Process control refused outright; path-changing calls refused outside the root."""
    for name in REFUSED:
        for module in (os, posix):
            if hasattr(module, name):
                setattr(module, name, _refusing(f"os.{name}"))
    for name in PATH_CHANGING:
        if hasattr(os, name):
            original = getattr(os, name)

            def guarded(*args, _original=original, _name=name, **kwargs):
                check(*args[:2], what=f"os.{_name} of")
                return _original(*args, **kwargs)
            setattr(os, name, guarded)
            if hasattr(posix, name):
                setattr(posix, name, guarded)


class _ImportBlocker:
    """A meta-path finder that refuses modules able to call C functions directly."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED_IMPORTS:
            raise ImportError(f"sandbox: importing {name} is not allowed")
        return None


def main() -> None:
    config = json.loads(sys.argv[1])
    set_limits(config["cpu_s"], config["memory_bytes"], config["file_bytes"])
    with open("main.py", encoding="utf-8") as file:
        source = file.read()
    install_guard(os.getcwd())
    sys.argv = ["main.py"]
    code = compile(source, "main.py", "exec")
    exec(code, {"__name__": "__main__" if config["as_main"] else "solution", "__builtins__": builtins})


if __name__ == "__main__":
    main()

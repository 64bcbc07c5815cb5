"""Finds and loads libstof: the copy installed with this package, else $STOF_LIB, else a build
folder of the source tree this package sits in (build, build-gpu, build-bench)."""
import ctypes
import os
import shutil

_HERE = os.path.dirname(os.path.abspath(__file__))


class StofError(RuntimeError):
    """An error from libstof, with its message (the words the `stof` command prints)."""


def _find_library():
    installed = os.path.join(_HERE, "libstof.so")
    if os.path.exists(installed):
        return installed
    env = os.environ.get("STOF_LIB")
    if env:
        return env
    for build in ("build", "build-gpu", "build-bench", "build-dev"):
        path = os.path.join(_HERE, "..", "..", build, "libstof.so")
        if os.path.exists(path):
            return path
    return "libstof.so"


def _use_compile_worker(lib_path):
    # NVRTC compiles one program at a time per process: the library hands compiles to
    # `stof __nvrtc-worker` processes when it knows the command
    if "STOF_COMPILE_WORKER" in os.environ:
        return
    exe = os.path.join(os.path.dirname(os.path.abspath(lib_path)), "stof")
    exe = exe if os.access(exe, os.X_OK) else shutil.which("stof")
    if exe:
        os.environ["STOF_COMPILE_WORKER"] = exe


def _use_package_scripts():
    # the model scripts installed with the package, for model directories
    scripts = os.path.join(_HERE, "scripts")
    if os.path.isdir(scripts):
        os.environ.setdefault("STOF_SCRIPTS_DIR", scripts)


LIBRARY_PATH = _find_library()
_use_compile_worker(LIBRARY_PATH)
_use_package_scripts()
_lib = ctypes.CDLL(LIBRARY_PATH)
_lib.stof_last_error.restype = ctypes.c_char_p
_lib.stof_version.restype = ctypes.c_char_p
_lib.stof_build_commit.restype = ctypes.c_char_p
_lib.stof_mask_density.restype = ctypes.c_double
_lib.stof_model_script.restype = ctypes.c_char_p


def _check(rc):
    if rc != 0:
        raise StofError(_lib.stof_last_error().decode())

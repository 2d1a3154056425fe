#!/bin/sh
# Build a self-contained, relocatable executor runtime: build-runtime.sh SRC DEST
#
# SRC is the Dockyard source tree; DEST (normally /opt/dockyard) receives:
#   DEST/python/       the running CPython (binary, libpython, standard library, the shared
#                      libraries its extension modules need), with Dockyard and its dependencies
#                      installed into its own site-packages
#   DEST/bin/task-executor   a launcher that runs it in isolated mode (-I)
#   DEST/sandbox/      bubblewrap (bin/bwrap, >= 0.8) and the libraries it needs (lib/), which
#                      the executor contains code under test with: $BWRAP, else the bwrap on PATH;
#                      left out, with a warning, when there is none
#
# The interpreter finds its standard library relative to its own path, and each binary finds its
# libraries through an RPATH of $ORIGIN/..., so nothing is exported into the environment
# (no PYTHONHOME, no LD_LIBRARY_PATH) that could leak into the task's own processes.
# The one thing not carried is the C library: the task image must have glibc at least as new as
# the one this runs on (Debian bullseye: 2.31). musl-based images (Alpine) are not supported.
set -eu

src=$1
dest=$2
py=$(command -v python3)
prefix=$("$py" -c 'import sys; print(sys.base_prefix)')
ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
shared=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("Py_ENABLE_SHARED") or 0)')

rt="$dest/python"
mkdir -p "$rt/bin" "$rt/lib" "$dest/bin"
cp -L "$prefix/bin/python$ver" "$rt/bin/python$ver"
cp -a "$prefix/lib/python$ver" "$rt/lib/"
# Not needed at run time, and the largest parts of the standard library.
rm -rf "$rt/lib/python$ver/test" "$rt/lib/python$ver/idlelib" "$rt/lib/python$ver/tkinter" \
       "$rt/lib/python$ver/ensurepip" "$rt/lib/python$ver/site-packages"
mkdir -p "$rt/lib/python$ver/site-packages"
if [ "$shared" = 1 ]; then
    cp -a "$prefix"/lib/libpython"$ver"*.so* "$rt/lib/"
fi

# Install Dockyard with this very interpreter's ABI into the runtime's site-packages.
"$py" -m pip install --no-cache-dir --no-compile --target "$rt/lib/python$ver/site-packages" "$src"

# Carry every shared library the interpreter and compiled modules load, except glibc's own.
ldd "$rt/bin/python$ver" "$rt/lib/python$ver/lib-dynload/"*.so \
    $(find "$rt/lib/python$ver/site-packages" -name '*.so') 2>/dev/null \
  | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
  | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*|libresolv.so*) ;;
            ld-linux*|libpython*) ;;
            *) [ -e "$rt/lib/$(basename "$lib")" ] || cp -L "$lib" "$rt/lib/" ;;
        esac
    done

# Point every binary at the carried libraries, relative to where it sits (DT_RPATH, which also
# serves the libraries' own dependencies, unlike DT_RUNPATH).
patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$rt/bin/python$ver"
for so in "$rt/lib/python$ver/lib-dynload/"*.so; do
    patchelf --force-rpath --set-rpath '$ORIGIN/../..' "$so"
done
for so in "$rt"/lib/*.so*; do
    [ -L "$so" ] || patchelf --force-rpath --set-rpath '$ORIGIN' "$so"
done

# The sandbox's bubblewrap, carried the same way (task images rarely have it). It runs outside the
# sandbox, as DOCKYARD_SANDBOX_UID, so it must not be setuid: $ORIGIN would not be honoured, and
# the sandbox needs no privilege from it.
bwrap=${BWRAP:-$(command -v bwrap || true)}
if [ -n "$bwrap" ]; then
    sb="$dest/sandbox"
    mkdir -p "$sb/bin" "$sb/lib"
    cp -L "$bwrap" "$sb/bin/bwrap"
    chmod 0755 "$sb/bin/bwrap"
    ldd "$sb/bin/bwrap" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
      | while read -r lib; do
            case "$(basename "$lib")" in
                libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
                *) cp -L "$lib" "$sb/lib/" ;;
            esac
        done
    patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$sb/bin/bwrap"
    for so in "$sb"/lib/*.so*; do
        [ -e "$so" ] && patchelf --force-rpath --set-rpath '$ORIGIN' "$so"
    done
    # The executor's launcher uses --disable-userns (bubblewrap 0.8): refuse an older one here
    # rather than ship a runtime whose every sandbox probe fails.
    "$sb/bin/bwrap" --help | grep -q -- --disable-userns || {
        echo "build-runtime.sh: $bwrap is older than bubblewrap 0.8 (no --disable-userns)" >&2
        exit 1
    }
else
    echo "build-runtime.sh: no bwrap to carry: code under test will be sandboxed only in task" \
         "images that have bubblewrap >= 0.8 themselves" >&2
fi

cat > "$dest/bin/task-executor" <<LAUNCHER
#!/bin/sh
# Dockyard executor carried into this image. -I: ignore the image's PYTHON* variables and user
# site-packages, so the task's Python setup and ours never mix.
here=\$(CDPATH= cd -- "\$(dirname -- "\$0")/.." && pwd)
for tool in git bash patch; do
    command -v "\$tool" >/dev/null 2>&1 || {
        echo "dockyard: this image has no '\$tool'; the executor needs git, bash and patch" >&2
        exit 127
    }
done
# The executor starts the sandbox's programs by absolute path from the system directories only
# (below), never from PATH. So the carried bwrap is linked into /usr/local/sbin, the first of
# them, unless the image put a bwrap of its own there (one in /usr/bin, often older than 0.8, is
# passed over). That needs root and a writable root filesystem; without it the image's own
# bubblewrap >= 0.8 is used, or /health says "bwrap not found". setpriv, prlimit and unshare come
# from the image's util-linux, which nearly every Debian/Ubuntu image has. Code under test's PATH
# is DOCKYARD_TASK_PATH, which nothing here changes.
system_has() {
    for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
        [ -x "\$dir/\$1" ] && return 0
    done
    return 1
}
carried="\$here/sandbox/bin/bwrap"
link=/usr/local/sbin/bwrap
if [ "\${1:-}" = serve ]; then  # only the server runs code under test (not --help at build)
    carried="\$here/sandbox/bin/bwrap"
    link=/usr/local/sbin/bwrap
    if [ -x "\$carried" ] && { [ ! -e "\$link" ] || [ "\$(readlink "\$link")" = "\$carried" ]; }
    then
        { mkdir -p /usr/local/sbin && ln -sfn "\$carried" "\$link"; } 2>/dev/null ||
            system_has bwrap ||
            echo "dockyard: cannot link \$carried into /usr/local/sbin (not root?): no sandbox" >&2
    fi
    system_has setpriv ||
        echo "dockyard: no setpriv (util-linux) in this image: a root executor has no sandbox" >&2
    system_has prlimit ||
        echo "dockyard: no prlimit (util-linux) in this image: code under test gets no rlimits" >&2
fi
exec "\$here/python/bin/python$ver" -I -c 'import sys; from task_executor.cli import main; sys.exit(main())' "\$@"
LAUNCHER
chmod 0755 "$dest/bin/task-executor"
"$dest/bin/task-executor" --help >/dev/null
echo "runtime built in $dest ($(du -sh "$dest" | cut -f1))"

# Sourced by the test scripts: `apt_install WHO ARGS...` installs Debian packages with apt-get
# (through sudo unless root); ARGS are apt-get install's options and packages. Without apt-get it
# says that WHO (e.g. "scripts/test.sh: the tests") needs the packages and fails.
apt_install() {
    local who="$1"
    shift
    if ! command -v apt-get >/dev/null; then
        local packages=() arg
        for arg in "$@"; do
            [[ "$arg" == -* ]] || packages+=("$arg")
        done
        echo "$who need ${packages[*]}: install them with your package manager" >&2
        return 1
    fi
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq "$@"
}

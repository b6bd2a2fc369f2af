# Sourced by the fetch scripts: `pip_download DEST ARGS...` runs `pip download --quiet --no-deps
# --dest DEST ARGS...` with whichever pip there is, or says what to install.
pip_download() {
    local dest="$1"
    shift
    local pip_cmd=()
    if command -v pip >/dev/null 2>&1; then
        pip_cmd=(pip)
    elif command -v python3 >/dev/null 2>&1; then
        pip_cmd=(python3 -m pip)
    else
        echo "$(basename "$0"): neither pip nor python3 found: install python3-pip, then run this script again" >&2
        return 1
    fi
    "${pip_cmd[@]}" download --quiet --no-deps --dest "$dest" "$@" >&2
}

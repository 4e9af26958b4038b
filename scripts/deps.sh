#!/usr/bin/env bash
# Installs the Debian packages nerve needs that are missing; nothing else.
#   scripts/deps.sh           what `make`, `make test` and `make demo` need
#   scripts/deps.sh --bench   also the peers `nerve bench` measures against (OpenBLAS, oneDNN, PyTorch)
# Works as root or through sudo. On a system without dpkg/apt it prints what to install and stops.
set -eu

# openssl, curl: make test serves HTTPS with a certificate openssl makes, and asks it with curl
# python3-jinja2: make test renders the chat templates nerve exports in Jinja (scripts/chat_template_check.py)
# nodejs: make test runs the chat page's script against a server (tests/webui_check.js)
# nettle-dev: the Uploads API checks an uploaded file's MD5 with Nettle
# libcurl4-openssl-dev: -hf and nerve pull fetch models from the Hugging Face Hub over HTTPS
packages=(gcc make libc6-dev binutils pkg-config libmicrohttpd-dev libcjson-dev libpcre2-dev libopenmpi-dev openmpi-bin libunistring-dev nettle-dev zlib1g-dev libcurl4-openssl-dev python3-jinja2
          openssl curl nodejs)
if [ "${1:-}" = "--bench" ]; then
    packages+=(libopenblas-dev libdnnl-dev python3-torch)
fi

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps.sh: this is not a Debian-like system; install the equivalents of: ${packages[*]}" >&2
    exit 1
fi

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "deps.sh: missing packages ${missing[*]}; run as root or install sudo" >&2
    exit 1
fi

echo "deps.sh: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

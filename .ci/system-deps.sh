#!/usr/bin/env bash
# Installs, non-interactively, the Debian packages amqpscope's tests need: RabbitMQ (a real broker
# for the live captures), tcpdump (to capture), tshark (the reference decoder), Java (Spark), and a
# C compiler with the Python headers (the install compiles the decoders with mypyc), Debian's
# Chromium with its WebDriver (the report's browser test: never a downloaded browser), and npm (make
# setup installs the report's plotly.js and the Data Docs' styles from the npm registry). Idempotent.
set -euo pipefail
need=()
command -v rabbitmq-server >/dev/null 2>&1 || need+=(rabbitmq-server)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v tshark >/dev/null 2>&1 || need+=(tshark)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v npm >/dev/null 2>&1 || need+=(npm)
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(sysconfig.get_path("include") + "/Python.h"))' \
  || need+=(python3-dev)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections
$sudo apt-get update -q
# policy-rc.d keeps the packaged RabbitMQ service from starting: tests run their own private broker.
$sudo apt-get install -y -q --no-install-recommends "${need[@]}"

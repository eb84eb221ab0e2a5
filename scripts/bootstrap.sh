#!/usr/bin/env bash
# Bootstraps this host as an AKS Flex Node: installs the agent release (downloaded and
# sha256-verified) into the install directory, or with --use-installed-agent uses the agent
# already there, then runs `aks-flex-node bootstrap-node`, which renders the config, runs
# preflight and runs start once. Inputs are AKS_FLEX_NODE_* variables from the environment or
# from --env-file, read as data (never sourced or evaluated); docs/bootstrap.md lists them.
# This script reads only the install inputs; the agent reads the rest.
set -euo pipefail

readonly PROG=bootstrap.sh
readonly DEFAULT_INSTALL_DIR=/usr/local/bin
readonly RELEASES=https://github.com/Azure/AKSFlexNode/releases/download

usage() {
	cat <<'EOF'
Usage: bootstrap.sh [--use-installed-agent] [--install-dir DIR] [--env-file FILE]

Installs the AKS Flex Node agent and bootstraps this host (config, preflight, start).

Options:
  --use-installed-agent  Use DIR/aks-flex-node instead of downloading the agent; fail if it
                         is not there (AKS_FLEX_NODE_USE_INSTALLED_AGENT=true)
  --install-dir DIR      Where the agent is installed (AKS_FLEX_NODE_INSTALL_DIR,
                         default /usr/local/bin)
  --env-file FILE        Read AKS_FLEX_NODE_* inputs from FILE (KEY=VALUE lines, read as data);
                         the environment wins over the file
  -h, --help             Show this help

Download inputs: AKS_FLEX_NODE_VERSION or AKS_FLEX_NODE_DOWNLOAD_URL, and AKS_FLEX_NODE_SHA256
(the archive's sha256, required). See docs/bootstrap.md for every input.
EOF
}

die() {
	printf '%s: %s\n' "$PROG" "$*" >&2
	exit 1
}

log() {
	printf '%s: %s\n' "$PROG" "$*" >&2
}

# Values read from --env-file, by key.
declare -A FILE_VALUES=()
# The download's temporary directory, removed on exit.
TMP_DIR=''

cleanup() {
	if [[ -n $TMP_DIR ]]; then
		rm -rf -- "$TMP_DIR"
	fi
}
trap cleanup EXIT

# ltrim/rtrim blanks (space and tab).
ltrim() {
	local s=$1
	printf '%s' "${s#"${s%%[![:blank:]]*}"}"
}
rtrim() {
	local s=$1
	printf '%s' "${s%"${s##*[![:blank:]]}"}"
}

# parse_env_file FILE: fills FILE_VALUES with the file's assignments, read as data with the
# same rules as the agent (agent/src/bootstrap/env.rs): `[export ]KEY=VALUE`, `#` comments,
# VALUE unquoted (to the line end), '...' (literal) or "..." (only \" and \\ are escapes).
# Nothing is expanded or evaluated. A key given twice: the last wins.
parse_env_file() {
	local file=$1 line key rest value n=0 c next i
	local -r bs=\\ dq=\"
	while IFS= read -r line || [[ -n $line ]]; do
		n=$((n + 1))
		line=${line%$'\r'}
		line=$(ltrim "$line")
		[[ -z $line || $line == '#'* ]] && continue
		if [[ $line =~ ^export[[:blank:]]+(.*)$ ]]; then
			line=${BASH_REMATCH[1]}
		fi
		if [[ $line != *=* ]]; then
			die "$file line $n: expected KEY=VALUE"
		fi
		key=${line%%=*}
		rest=${line#*=}
		if [[ ! $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
			die "$file line $n: expected KEY=VALUE with KEY made of letters, digits and _ (no blanks around =)"
		fi
		if [[ $key != AKS_FLEX_NODE_* ]]; then
			die "$file line $n: $key is not an AKS_FLEX_NODE_* setting; only those are read"
		fi
		case $rest in
		[[:blank:]]*)
			die "$file line $n: blank after = (quote a value that starts with a blank)"
			;;
		"'"*)
			rest=${rest:1}
			[[ $rest == *"'"* ]] || die "$file line $n: unterminated single quote"
			value=${rest%%"'"*}
			rest=${rest#*"'"}
			;;
		'"'*)
			value=
			i=1
			while :; do
				((i < ${#rest})) || die "$file line $n: unterminated double quote"
				c=${rest:i:1}
				next=${rest:i+1:1}
				if [[ $c == "$dq" ]]; then
					i=$((i + 1))
					break
				elif [[ $c == "$bs" ]] && [[ $next == "$dq" || $next == "$bs" ]]; then
					value+=$next
					i=$((i + 2))
				else
					value+=$c
					i=$((i + 1))
				fi
			done
			rest=${rest:i}
			;;
		*)
			value=$(rtrim "$rest")
			rest=
			;;
		esac
		rest=$(ltrim "$rest")
		if [[ -n $rest && $rest != '#'* ]]; then
			die "$file line $n: unexpected text after the closing quote (only a # comment may follow)"
		fi
		FILE_VALUES[$key]=$value
	done <"$file"
}

# input NAME: the environment's non-empty value, else the env file's, else empty. NAME is
# always one of this script's fixed input names.
input() {
	local name=$1
	local v=${!name-}
	if [[ -z $v ]]; then
		v=${FILE_VALUES[$name]-}
	fi
	printf '%s' "$v"
}

# bool NAME VALUE: prints true or false; true/false (any case), 1/0, empty = false.
bool() {
	case ${2,,} in
	true | 1) echo true ;;
	false | 0 | '') echo false ;;
	*) die "$1: \"$2\" is not true, false, 1 or 0" ;;
	esac
}

arch() {
	case $(uname -m) in
	x86_64 | amd64) echo amd64 ;;
	aarch64 | arm64) echo arm64 ;;
	*) die "unsupported architecture $(uname -m) (amd64 and arm64 are supported)" ;;
	esac
}

# fetch URL OUT: downloads with curl, else wget. The URL is never printed and never put on a
# command line (it may carry a token, as a SAS URL does, and any user can read a process's
# arguments in /proc): it goes on the tool's standard input, as a curl config line
# (`url = "..."`, with \ and " escaped as curl's config syntax wants) or as wget's input file.
fetch() {
	local url=$1 out=$2 quoted
	case $url in
	*$'\n'* | *$'\r'*) die "the download URL contains a line break" ;;
	esac
	if command -v curl >/dev/null 2>&1; then
		quoted=${url//\\/\\\\}
		quoted=${quoted//\"/\\\"}
		printf 'url = "%s"\n' "$quoted" |
			curl -fsSL --retry 3 --connect-timeout 30 -o "$out" --config - ||
			die "download failed (curl exit $?)"
	elif command -v wget >/dev/null 2>&1; then
		printf '%s\n' "$url" |
			wget -q -T 30 -t 3 -O "$out" --input-file=- ||
			die "download failed (wget exit $?)"
	else
		die "neither curl nor wget is installed"
	fi
}

sha256_of() {
	sha256sum "$1" | cut -d' ' -f1
}

install_agent() {
	local dir=$1 version url expected a actual bin c
	version=$(input AKS_FLEX_NODE_VERSION)
	url=$(input AKS_FLEX_NODE_DOWNLOAD_URL)
	expected=$(input AKS_FLEX_NODE_SHA256)
	expected=${expected,,}
	a=$(arch)
	if [[ -z $url ]]; then
		[[ -n $version ]] || die "set AKS_FLEX_NODE_VERSION or AKS_FLEX_NODE_DOWNLOAD_URL (or use --use-installed-agent)"
		[[ $version =~ ^[A-Za-z0-9._+-]+$ ]] || die "AKS_FLEX_NODE_VERSION \"$version\" is not a release tag"
		url="$RELEASES/$version/aks-flex-node-linux-$a.tar.gz"
	fi
	[[ -n $expected ]] || die "AKS_FLEX_NODE_SHA256 is required to download the agent (the sha256 of the release archive)"
	[[ $expected =~ ^[0-9a-f]{64}$ ]] || die "AKS_FLEX_NODE_SHA256 is not a sha256 digest (64 hex digits)"

	TMP_DIR=$(mktemp -d)
	local tmp=$TMP_DIR
	log "downloading the agent ${version:-from AKS_FLEX_NODE_DOWNLOAD_URL} (linux-$a)"
	fetch "$url" "$tmp/agent.tar.gz"
	actual=$(sha256_of "$tmp/agent.tar.gz")
	if [[ $actual != "$expected" ]]; then
		die "sha256 mismatch for the downloaded archive: expected $expected, got $actual"
	fi
	mkdir "$tmp/x"
	tar -xzf "$tmp/agent.tar.gz" -C "$tmp/x" --no-same-owner ||
		die "the downloaded archive is not a gzip tar archive"
	bin=
	for c in "aks-flex-node-linux-$a" aks-flex-node; do
		if [[ -f $tmp/x/$c && ! -L $tmp/x/$c ]]; then
			bin=$tmp/x/$c
			break
		fi
	done
	[[ -n $bin ]] || die "the archive has neither aks-flex-node-linux-$a nor aks-flex-node"
	mkdir -p -- "$dir"
	# Atomic replace: a running agent keeps its old inode.
	install -m 0755 -- "$bin" "$dir/.aks-flex-node.new"
	mv -f -- "$dir/.aks-flex-node.new" "$dir/aks-flex-node"
	cleanup
	TMP_DIR=''
	log "installed $dir/aks-flex-node"
}

main() {
	local use_installed='' install_dir='' env_file=''
	while (($# > 0)); do
		case $1 in
		--use-installed-agent) use_installed=true ;;
		--install-dir)
			(($# >= 2)) || die "--install-dir needs a directory"
			install_dir=$2
			shift
			;;
		--install-dir=*) install_dir=${1#*=} ;;
		--env-file)
			(($# >= 2)) || die "--env-file needs a file"
			env_file=$2
			shift
			;;
		--env-file=*) env_file=${1#*=} ;;
		-h | --help)
			usage
			exit 0
			;;
		*)
			printf '%s: unknown argument %s\n' "$PROG" "$1" >&2
			usage >&2
			exit 2
			;;
		esac
		shift
	done

	if [[ -n $env_file ]]; then
		[[ -f $env_file && -r $env_file ]] || die "cannot read env file $env_file"
		parse_env_file "$env_file"
	fi
	if [[ -z $install_dir ]]; then
		install_dir=$(input AKS_FLEX_NODE_INSTALL_DIR)
	fi
	if [[ -z $install_dir ]]; then
		install_dir=$DEFAULT_INSTALL_DIR
	fi
	if [[ -z $use_installed ]]; then
		use_installed=$(bool AKS_FLEX_NODE_USE_INSTALLED_AGENT "$(input AKS_FLEX_NODE_USE_INSTALLED_AGENT)")
	fi

	local agent=$install_dir/aks-flex-node
	if [[ $use_installed == true ]]; then
		[[ -f $agent && -x $agent ]] ||
			die "--use-installed-agent: there is no executable aks-flex-node in $install_dir"
		log "using the installed agent $agent"
	else
		install_agent "$install_dir"
	fi

	local args=(bootstrap-node)
	[[ -z $env_file ]] || args+=(--env-file "$env_file")
	exec "$agent" "${args[@]}"
}

main "$@"

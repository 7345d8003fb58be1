# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_lockctl_global_optspecs
    string join \n r/redis= redis-file= prefix= node-timeout= tls-ca= tls-cert= tls-key= drift-factor= quarantine= q/quiet v/verbose h/help V/version
end

function __fish_lockctl_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_lockctl_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_lockctl_using_subcommand
    set -l cmd (__fish_lockctl_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c lockctl -n "__fish_lockctl_needs_command" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_needs_command" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_needs_command" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_needs_command" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_needs_command" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_needs_command" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_needs_command" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_needs_command" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_needs_command" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_needs_command" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_needs_command" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_needs_command" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "acquire" -d 'Acquire a lock and print its token'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "release" -d 'Release a lock, only if TOKEN still holds it'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "renew" -d 'Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "exec" -d 'Run a command while holding the lock, renewing it, and release it afterwards'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "status" -d 'Show who holds a lock (exit 0 held, 1 free)'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "list" -d 'List held locks whose name matches a glob'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "break" -d 'Delete a lock whoever holds it (operator override)'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "doctor" -d 'Check the nodes for hazards that break locks'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "completions" -d 'Print a shell completion script'
complete -c lockctl -n "__fish_lockctl_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l ttl -d 'Lease time to live' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s w -l wait -d 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s E -l conflict-exit-code -d 'Exit code when the lock is busy, instead of 75' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l limit -d 'Slots: up to N holders at once (a counting semaphore) [1..=1000]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l note -d 'Free text kept with the holder and waiter records (a CI job URL, a ticket)' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l format -d 'Output: plain prints the token; env prints `export` lines for eval; json prints an object' -r -f -a "plain\t'The token alone'
env\t'Shell `export` lines, for eval'
json\t'One JSON object'"
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s n -l no-wait -d 'One attempt: fail at once if the lock is busy'
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -l supersede -d 'Newest wins among waiters: displace the older waiters of NAME'
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand acquire" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l token -d 'The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand release" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l token -d 'The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l ttl -d 'New time to live from now [default: the TTL of the grant; 30s for a lock lockctl did not grant]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand renew" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l ttl -d 'Lease time to live' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s w -l wait -d 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s E -l conflict-exit-code -d 'Exit code when the lock is busy, instead of 75' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l limit -d 'Slots: up to N holders at once (a counting semaphore) [1..=1000]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l note -d 'Free text kept with the holder and waiter records (a CI job URL, a ticket)' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l kill-after -d 'After SIGTERM, wait this long before SIGKILL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s c -l command -d 'Run COMMAND with `sh -c`' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s n -l no-wait -d 'One attempt: fail at once if the lock is busy'
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -l supersede -d 'Newest wins among waiters: displace the older waiters of NAME'
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand exec" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l format -d 'Output format' -r -f -a "plain\t'Aligned text for people'
json\t'JSON for programs'"
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand status" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l format -d 'Output format' -r -f -a "plain\t'Aligned text for people'
json\t'JSON for programs'"
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand list" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l token -d 'Break only the holder with this token (one slot of a --limit N semaphore) [default: every holder]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -s y -l yes -d 'Do not ask; required when stdin is not a terminal'
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand break" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l ttl -d 'The lease TTL your jobs use (uptime and latency are judged against it)' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l format -d 'Output format' -r -f -a "plain\t'Aligned text for people'
json\t'JSON for programs'"
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -s r -l redis -d 'Redis node URL; repeat for Redlock over several masters' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l redis-file -d 'File with the node URLs, one per line, instead of --redis' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l prefix -d 'Key prefix for lock keys' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l node-timeout -d 'Bound on connecting to, and on each command to, one node' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l tls-ca -d 'CA certificate (PEM) to verify rediss:// servers instead of the system roots' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l tls-cert -d 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l tls-key -d 'Private key (PEM) of the client certificate (with --tls-cert)' -r -F
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l drift-factor -d 'Clock drift allowance as a fraction of the TTL' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -l quarantine -d 'Nodes up for less than this do not vote [default: the TTL]' -r
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -s q -l quiet -d 'No diagnostics on stderr (results and errors still print)'
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -s v -l verbose -d 'Log each step with its timing on stderr'
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockctl -n "__fish_lockctl_using_subcommand completions" -s V -l version -d 'Print version'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "acquire" -d 'Acquire a lock and print its token'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "release" -d 'Release a lock, only if TOKEN still holds it'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "renew" -d 'Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "exec" -d 'Run a command while holding the lock, renewing it, and release it afterwards'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "status" -d 'Show who holds a lock (exit 0 held, 1 free)'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "list" -d 'List held locks whose name matches a glob'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "break" -d 'Delete a lock whoever holds it (operator override)'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "doctor" -d 'Check the nodes for hazards that break locks'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "completions" -d 'Print a shell completion script'
complete -c lockctl -n "__fish_lockctl_using_subcommand help; and not __fish_seen_subcommand_from acquire release renew exec status list break doctor completions help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'

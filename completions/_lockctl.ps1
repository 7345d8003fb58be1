
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'lockctl' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'lockctl'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'lockctl' {
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('acquire', 'acquire', [CompletionResultType]::ParameterValue, 'Acquire a lock and print its token')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Release a lock, only if TOKEN still holds it')
            [CompletionResult]::new('renew', 'renew', [CompletionResultType]::ParameterValue, 'Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms')
            [CompletionResult]::new('exec', 'exec', [CompletionResultType]::ParameterValue, 'Run a command while holding the lock, renewing it, and release it afterwards')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show who holds a lock (exit 0 held, 1 free)')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'List held locks whose name matches a glob')
            [CompletionResult]::new('break', 'break', [CompletionResultType]::ParameterValue, 'Delete a lock whoever holds it (operator override)')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the nodes for hazards that break locks')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'lockctl;acquire' {
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Lease time to live')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit code when the lock is busy, instead of 75')
            [CompletionResult]::new('--conflict-exit-code', '--conflict-exit-code', [CompletionResultType]::ParameterName, 'Exit code when the lock is busy, instead of 75')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Slots: up to N holders at once (a counting semaphore) [1..=1000]')
            [CompletionResult]::new('--note', '--note', [CompletionResultType]::ParameterName, 'Free text kept with the holder and waiter records (a CI job URL, a ticket)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output: plain prints the token; env prints `export` lines for eval; json prints an object')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'One attempt: fail at once if the lock is busy')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'One attempt: fail at once if the lock is busy')
            [CompletionResult]::new('--supersede', '--supersede', [CompletionResultType]::ParameterName, 'Newest wins among waiters: displace the older waiters of NAME')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;release' {
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;renew' {
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'New time to live from now [default: the TTL of the grant; 30s for a lock lockctl did not grant]')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;exec' {
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Lease time to live')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit code when the lock is busy, instead of 75')
            [CompletionResult]::new('--conflict-exit-code', '--conflict-exit-code', [CompletionResultType]::ParameterName, 'Exit code when the lock is busy, instead of 75')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Slots: up to N holders at once (a counting semaphore) [1..=1000]')
            [CompletionResult]::new('--note', '--note', [CompletionResultType]::ParameterName, 'Free text kept with the holder and waiter records (a CI job URL, a ticket)')
            [CompletionResult]::new('--kill-after', '--kill-after', [CompletionResultType]::ParameterName, 'After SIGTERM, wait this long before SIGKILL')
            [CompletionResult]::new('-c', '-c', [CompletionResultType]::ParameterName, 'Run COMMAND with `sh -c`')
            [CompletionResult]::new('--command', '--command', [CompletionResultType]::ParameterName, 'Run COMMAND with `sh -c`')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'One attempt: fail at once if the lock is busy')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'One attempt: fail at once if the lock is busy')
            [CompletionResult]::new('--supersede', '--supersede', [CompletionResultType]::ParameterName, 'Newest wins among waiters: displace the older waiters of NAME')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;status' {
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;list' {
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;break' {
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Break only the holder with this token (one slot of a --limit N semaphore) [default: every holder]')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask; required when stdin is not a terminal')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask; required when stdin is not a terminal')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;doctor' {
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'The lease TTL your jobs use (uptime and latency are judged against it)')
            [CompletionResult]::new('--format', '--format', [CompletionResultType]::ParameterName, 'Output format')
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;completions' {
            [CompletionResult]::new('-r', '-r', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis', '--redis', [CompletionResultType]::ParameterName, 'Redis node URL; repeat for Redlock over several masters')
            [CompletionResult]::new('--redis-file', '--redis-file', [CompletionResultType]::ParameterName, 'File with the node URLs, one per line, instead of --redis')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Key prefix for lock keys')
            [CompletionResult]::new('--node-timeout', '--node-timeout', [CompletionResultType]::ParameterName, 'Bound on connecting to, and on each command to, one node')
            [CompletionResult]::new('--tls-ca', '--tls-ca', [CompletionResultType]::ParameterName, 'CA certificate (PEM) to verify rediss:// servers instead of the system roots')
            [CompletionResult]::new('--tls-cert', '--tls-cert', [CompletionResultType]::ParameterName, 'Client certificate (PEM) for rediss:// servers that require one (with --tls-key)')
            [CompletionResult]::new('--tls-key', '--tls-key', [CompletionResultType]::ParameterName, 'Private key (PEM) of the client certificate (with --tls-cert)')
            [CompletionResult]::new('--drift-factor', '--drift-factor', [CompletionResultType]::ParameterName, 'Clock drift allowance as a fraction of the TTL')
            [CompletionResult]::new('--quarantine', '--quarantine', [CompletionResultType]::ParameterName, 'Nodes up for less than this do not vote [default: the TTL]')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No diagnostics on stderr (results and errors still print)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log each step with its timing on stderr')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'lockctl;help' {
            [CompletionResult]::new('acquire', 'acquire', [CompletionResultType]::ParameterValue, 'Acquire a lock and print its token')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Release a lock, only if TOKEN still holds it')
            [CompletionResult]::new('renew', 'renew', [CompletionResultType]::ParameterValue, 'Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms')
            [CompletionResult]::new('exec', 'exec', [CompletionResultType]::ParameterValue, 'Run a command while holding the lock, renewing it, and release it afterwards')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show who holds a lock (exit 0 held, 1 free)')
            [CompletionResult]::new('list', 'list', [CompletionResultType]::ParameterValue, 'List held locks whose name matches a glob')
            [CompletionResult]::new('break', 'break', [CompletionResultType]::ParameterValue, 'Delete a lock whoever holds it (operator override)')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Check the nodes for hazards that break locks')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'lockctl;help;acquire' {
            break
        }
        'lockctl;help;release' {
            break
        }
        'lockctl;help;renew' {
            break
        }
        'lockctl;help;exec' {
            break
        }
        'lockctl;help;status' {
            break
        }
        'lockctl;help;list' {
            break
        }
        'lockctl;help;break' {
            break
        }
        'lockctl;help;doctor' {
            break
        }
        'lockctl;help;completions' {
            break
        }
        'lockctl;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}

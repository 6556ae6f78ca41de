//! The `intercept:` section (docs/config.md, "Interception"; docs/ebpf.md): Service addresses
//! the agent intercepts in the kernel off-cluster, each sent to one of its pools — the file
//! form of `--redirect VIP=LISTENER` and `--steer VIP` (on Kubernetes, `kubernetes.intercept`
//! names Services and their VIPs follow them instead).

use std::net::SocketAddr;

use serde::Deserialize;

use super::{ConfigError, PoolConfig};

/// One entry of the file's `intercept:` list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct InterceptFile {
    /// `IP:PORT` or `[IPv6]:PORT` clients dial (a Service's ClusterIP and port).
    vip: String,
    /// The pool its requests go to; default: the first.
    pool: Option<String>,
    /// Where intercepted connects are sent: an address of this agent's proxy listener that
    /// clients can reach; default: the first listener (which must then not listen on every
    /// address, unless `$POD_IP` names the node).
    target: Option<String>,
    /// Steer mode: connects go straight to a pod chosen in the kernel (docs/ebpf.md).
    #[serde(default)]
    steer: bool,
}

/// An intercepted address, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterceptRule {
    pub vip: SocketAddr,
    /// The pool's name (one of the configuration's); `None`: not given, the first pool. A
    /// VIP of an agent with several pools carries every model's requests, so only a VIP
    /// whose pool is given is steered by that pool's policy (docs/ebpf.md, "Steer mode").
    pub pool: Option<String>,
    /// `None`: the first proxy listener, resolved when interception starts.
    pub target: Option<SocketAddr>,
    pub steer: bool,
}

/// Checks the section: each address parses with a port, is listed once, names a pool of the
/// file; errors name the entry (`intercept[1].vip: ...`).
pub(super) fn convert(
    entries: Vec<InterceptFile>,
    pools: &[PoolConfig],
    file: &str,
) -> Result<Vec<InterceptRule>, ConfigError> {
    let mut out: Vec<InterceptRule> = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        let err = |field: &str, message: String| {
            ConfigError::field(file, format!("intercept[{i}].{field}"), message)
        };
        let address = |field: &str, text: &str| -> Result<SocketAddr, ConfigError> {
            let a: SocketAddr = text
                .parse()
                .map_err(|_| err(field, format!("`{text}` is not IP:PORT (or [IPv6]:PORT)")))?;
            if a.port() == 0 || a.ip().is_unspecified() {
                return Err(err(
                    field,
                    format!("`{text}`: needs a specific address and a port other than 0"),
                ));
            }
            Ok(a)
        };
        let vip = address("vip", &e.vip)?;
        if out.iter().any(|r| r.vip == vip) {
            return Err(err("vip", format!("{vip} is listed twice")));
        }
        let target = e
            .target
            .as_deref()
            .map(|t| address("target", t))
            .transpose()?;
        if let Some(t) = target
            && t.is_ipv4() != vip.is_ipv4()
        {
            return Err(err(
                "target",
                format!("{t} is of the other address family than {vip}"),
            ));
        }
        if let Some(name) = &e.pool
            && !pools.iter().any(|p| &p.name == name)
        {
            return Err(err("pool", format!("no pool is named `{name}`")));
        }
        out.push(InterceptRule {
            vip,
            pool: e.pool,
            target,
            steer: e.steer,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(entries: &str) -> Result<Vec<InterceptRule>, String> {
        let text = format!(
            "version: 1\npools:\n- {{name: chat, model: m, endpoints: [{{url: 'http://127.0.0.1:8100'}}]}}\n- {{name: code, model: c, endpoints: [{{url: 'http://127.0.0.1:8101'}}]}}\nintercept:\n{entries}"
        );
        super::super::parse(&text, "agent.yaml")
            .map(|c| c.intercept)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn entries_default_to_the_first_pool_and_the_listener() {
        let rules = parse(
            "- {vip: '10.96.0.10:8000'}\n- {vip: '[fd00:96::10]:8000', pool: code, target: '[fd00:231::1]:8080', steer: true}\n",
        )
        .unwrap();
        assert_eq!(
            rules,
            vec![
                InterceptRule {
                    vip: "10.96.0.10:8000".parse().unwrap(),
                    pool: None,
                    target: None,
                    steer: false,
                },
                InterceptRule {
                    vip: "[fd00:96::10]:8000".parse().unwrap(),
                    pool: Some("code".into()),
                    target: Some("[fd00:231::1]:8080".parse().unwrap()),
                    steer: true,
                },
            ]
        );
    }

    #[test]
    fn bad_entries_name_the_field() {
        let cases = [
            (
                "- {vip: '10.96.0.10'}\n",
                "intercept[0].vip: `10.96.0.10` is not IP:PORT",
            ),
            (
                "- {vip: '0.0.0.0:80'}\n",
                "intercept[0].vip: `0.0.0.0:80`: needs a specific address",
            ),
            (
                "- {vip: '10.96.0.10:0'}\n",
                "intercept[0].vip: `10.96.0.10:0`: needs a specific address",
            ),
            (
                "- {vip: '10.96.0.10:80'}\n- {vip: '10.96.0.10:80'}\n",
                "intercept[1].vip: 10.96.0.10:80 is listed twice",
            ),
            (
                "- {vip: '10.96.0.10:80', pool: nope}\n",
                "intercept[0].pool: no pool is named `nope`",
            ),
            (
                "- {vip: '10.96.0.10:80', target: '[::1]:8080'}\n",
                "intercept[0].target: [::1]:8080 is of the other address family",
            ),
            (
                "- {vip: '10.96.0.10:80', port: 1}\n",
                "unknown field `port`",
            ),
        ];
        for (entries, want) in cases {
            let got = parse(entries).unwrap_err();
            assert!(got.contains(want), "{entries}: {got}");
        }
    }
}

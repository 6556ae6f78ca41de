//! The facts' encodings: every one reads back and stays under the bound; bad values are
//! errors that say what is wrong.

use proptest::prelude::*;

use super::*;

fn id_strategy() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:/-]{1,128}"
}

fn rate_strategy() -> impl Strategy<Value = Rate> {
    prop_oneof![
        Just(Rate::default()),
        Just(Rate::MAX),
        (0..=Rate::MAX.milli()).prop_map(Rate::from_milli),
    ]
}

fn fact_strategy() -> impl Strategy<Value = Fact> {
    let health = prop_oneof![
        Just(PodHealth::Healthy),
        Just(PodHealth::Waiting),
        Just(PodHealth::Unsure),
        Just(PodHealth::Stalled),
    ];
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>(), any::<Option<u16>>()).prop_map(|(ip, port, proxy)| {
            Fact::Agent(AgentFact {
                grpc: (ip, port).into(),
                proxy: proxy.map(|p| ([127, 0, 0, 1], p).into()),
            })
        }),
        (id_strategy(), id_strategy(), id_strategy(), health).prop_map(
            |(pod, model, addr, health)| Fact::Pod {
                pod,
                fact: PodFact {
                    model,
                    addr,
                    health
                },
            }
        ),
        (id_strategy(), any::<u64>(), any::<u64>()).prop_map(|(pod, i, s)| Fact::Watermark {
            pod,
            at: Watermark {
                incarnation: i,
                sequence: s
            },
        }),
        (
            id_strategy(),
            any::<u32>(),
            any::<u32>(),
            0..=MAX_KV_PERMILLE
        )
            .prop_map(|(pod, running, waiting, kv_permille)| Fact::Load {
                pod,
                load: LoadFact {
                    running,
                    waiting,
                    kv_permille
                },
            }),
        (
            "[A-Za-z0-9._:/-]{1,64}",
            [rate_strategy(), rate_strategy(), rate_strategy()]
        )
            .prop_map(|(tenant, [r, p, o])| Fact::Usage {
                tenant,
                usage: UsageFact {
                    requests: r,
                    prompt_tokens: p,
                    output_tokens: o,
                },
            }),
        (
            "[A-Za-z0-9._:/-]{1,64}",
            any::<i32>(),
            1..=u32::MAX,
            any::<u32>()
        )
            .prop_map(|(tenant, priority, weight, demand)| Fact::Contention {
                tenant,
                contention: Contention {
                    priority,
                    weight,
                    demand,
                },
            }),
        any::<u64>().prop_map(Fact::ContentionRound),
    ]
}

proptest! {
    #[test]
    fn every_fact_reads_back_and_stays_below_the_bound(fact in fact_strategy()) {
        let value = fact.value().expect("valid ids");
        prop_assert!(value.len() <= MAX_FACT_BYTES, "{} bytes", value.len());
        prop_assert_eq!(Fact::parse(&fact.key(), &value), Ok(fact));
    }

    #[test]
    fn garbage_is_an_error_never_a_panic(key in "(agent|pod:|wm:|load:|usage:|fair:|x)[ -~]{0,40}", value in "[ -~]{0,80}") {
        let _ = Fact::parse(&key, &value);
    }
}

#[test]
fn bad_values_say_what_is_wrong() {
    assert_eq!(
        Fact::parse("wm:pod-a", "12"),
        Err(FactError::Malformed {
            key: "wm:pod-a".into(),
            why: "not INCARNATION:SEQUENCE".into()
        })
    );
    assert!(matches!(
        Fact::parse("pod:", "v1 model=m addr=a health=healthy"),
        Err(FactError::Invalid {
            why: "is empty",
            ..
        })
    ));
    assert!(matches!(
        Fact::parse("pod:p", "v2 model=m addr=a health=healthy"),
        Err(FactError::Malformed { .. })
    ));
    assert_eq!(
        Fact::parse("nodes", "x"),
        Err(FactError::UnknownKey("nodes".into()))
    );
    let long = "m".repeat(129);
    let fact = Fact::Pod {
        pod: "p".into(),
        fact: PodFact {
            model: long,
            addr: "127.0.0.1:1".into(),
            health: PodHealth::Healthy,
        },
    };
    assert!(matches!(
        fact.value(),
        Err(FactError::Invalid {
            what: "model name",
            ..
        })
    ));
    // Words a newer agent adds are ignored.
    assert_eq!(
        Fact::parse("load:p", "v1 running=1 waiting=2 kv=3 hot=yes"),
        Ok(Fact::Load {
            pod: "p".into(),
            load: LoadFact {
                running: 1,
                waiting: 2,
                kv_permille: 3
            }
        })
    );
}

fn usage(key: &str, value: &str) -> Result<Fact, FactError> {
    Fact::parse(key, value)
}

fn rates(r: u64, p: u64, o: u64) -> UsageFact {
    UsageFact {
        requests: Rate::from_milli(r),
        prompt_tokens: Rate::from_milli(p),
        output_tokens: Rate::from_milli(o),
    }
}

#[test]
fn a_usage_fact_reads_back_with_three_decimals() {
    let fact = Fact::Usage {
        tenant: "team-a/batch".into(),
        usage: rates(12_500, 1_000_000_001, 7),
    };
    assert_eq!(fact.key(), "usage:team-a/batch");
    let value = fact.value().expect("a valid tenant");
    assert_eq!(value, "v1 req=12.5 pt=1000000.001 ot=0.007");
    assert_eq!(usage(&fact.key(), &value), Ok(fact));
    // The longest value: three rates at the maximum.
    let max = Fact::Usage {
        tenant: "t".repeat(64),
        usage: UsageFact {
            requests: Rate::MAX,
            prompt_tokens: Rate::MAX,
            output_tokens: Rate::MAX,
        },
    };
    assert_eq!(
        max.value().as_deref(),
        Ok("v1 req=1000000000 pt=1000000000 ot=1000000000")
    );
    assert_eq!(
        usage("usage:t", "v1 req=999999999.999 pt=0.5 ot=0").map(|f| f.value()),
        Ok(Ok("v1 req=999999999.999 pt=0.5 ot=0".to_string()))
    );
    // Words a newer agent adds are ignored; leading zeros read as the number.
    assert_eq!(
        usage("usage:t", "v1 req=007 pt=1.10 ot=2 cc=4"),
        Ok(Fact::Usage {
            tenant: "t".into(),
            usage: rates(7_000, 1_100, 2_000),
        })
    );
}

#[test]
fn a_contention_fact_reads_back_and_refuses_what_is_not_one() {
    let fact = Fact::Contention {
        tenant: "team-a".into(),
        contention: Contention {
            priority: -3,
            weight: 4,
            demand: 12,
        },
    };
    assert_eq!(fact.key(), "fair:team-a");
    let value = fact.value().expect("a valid tenant");
    assert_eq!(value, "v1 pri=-3 w=4 dem=12");
    assert_eq!(Fact::parse(&fact.key(), &value), Ok(fact));
    // The longest value: every number at its widest.
    let widest = Fact::Contention {
        tenant: "t".repeat(64),
        contention: Contention {
            priority: i32::MIN,
            weight: u32::MAX,
            demand: u32::MAX,
        },
    };
    assert_eq!(
        widest.value().as_deref(),
        Ok("v1 pri=-2147483648 w=4294967295 dem=4294967295")
    );
    let bad = |value: &str, why: &str| {
        assert_eq!(
            Fact::parse("fair:t", value),
            Err(FactError::Malformed {
                key: "fair:t".into(),
                why: why.into()
            }),
            "{value}"
        );
    };
    bad("v2 pri=0 w=1 dem=1", "not a v1 value");
    bad("v1 pri=0 w=1", "no dem=");
    bad("v1 pri=0 w=0 dem=1", "w= is 0 (weights are at least 1)");
    bad("v1 pri=0 w=1 dem=-1", "dem=\"-1\" is not a number");
    bad(
        "v1 pri=0 w=1 dem=4294967296",
        "dem=\"4294967296\" is not a number",
    );
    bad("v1 pri=x w=1 dem=1", "pri=\"x\" is not a number");
    assert!(matches!(
        Fact::parse("fair:a b", "v1 pri=0 w=1 dem=1"),
        Err(FactError::Invalid { .. })
    ));
}

#[test]
fn a_pools_contention_fact_names_tenant_and_pool() {
    let fact = Fact::Contention {
        tenant: "team-a@pool-1".into(),
        contention: Contention {
            priority: 1,
            weight: 2,
            demand: 3,
        },
    };
    assert_eq!(fact.key(), "fair:team-a@pool-1");
    let value = fact.value().expect("a valid tenant and pool");
    assert_eq!(Fact::parse(&fact.key(), &value), Ok(fact));
    for bad in ["fair:a@b@c", "fair:a@", "fair:@p", "fair:a b@p"] {
        assert!(
            matches!(Fact::parse(bad, &value), Err(FactError::Invalid { .. })),
            "{bad}"
        );
    }
}

#[test]
fn the_contention_round_reads_back_and_refuses_what_is_not_one() {
    let widest = Fact::ContentionRound(u64::MAX);
    assert_eq!(widest.key(), "fair");
    let value = widest.value().expect("a number");
    assert_eq!(value, "v1 round=18446744073709551615");
    assert_eq!(value.len(), 29);
    assert_eq!(Fact::parse("fair", &value), Ok(widest));
    assert_eq!(
        Fact::parse("fair", "v1 round=-1"),
        Err(FactError::Malformed {
            key: "fair".into(),
            why: "round=\"-1\" is not a number".into()
        })
    );
}

#[test]
fn demands_convert_clamped_and_rounded() {
    use crate::usage::Demand;
    let d = Demand {
        requests: 2.0004,
        prompt_tokens: f64::NAN,
        output_tokens: -3.0,
    };
    assert_eq!(UsageFact::from_demand(&d), rates(2_000, 0, 0));
    let d = Demand {
        requests: f64::INFINITY,
        prompt_tokens: 1e12,
        output_tokens: 0.0015,
    };
    assert_eq!(
        UsageFact::from_demand(&d),
        UsageFact {
            requests: Rate::MAX,
            prompt_tokens: Rate::MAX,
            output_tokens: Rate::from_milli(2),
        }
    );
    assert_eq!(
        rates(1_500, 250, 0).demand(),
        Demand {
            requests: 1.5,
            prompt_tokens: 0.25,
            output_tokens: 0.0,
        }
    );
    assert!(rates(0, 0, 0).is_zero() && !rates(0, 0, 1).is_zero());
}

#[test]
fn bad_usage_values_say_what_is_wrong() {
    let cases: &[(&str, &str)] = &[
        (
            "v1 req=NaN pt=0 ot=0",
            "req=\"NaN\" is not a decimal number (digits, at most one '.')",
        ),
        (
            "v1 req=inf pt=0 ot=0",
            "req=\"inf\" is not a decimal number (digits, at most one '.')",
        ),
        ("v1 req=1 pt=-2 ot=0", "pt=\"-2\" is negative"),
        (
            "v1 req=1 pt=2 ot=1e3",
            "ot=\"1e3\" is not a decimal number (digits, at most one '.')",
        ),
        (
            "v1 req=1. pt=2 ot=3",
            "req=\"1.\" is not a decimal number (digits, at most one '.')",
        ),
        (
            "v1 req=.5 pt=2 ot=3",
            "req=\".5\" is not a decimal number (digits, at most one '.')",
        ),
        (
            "v1 req=1.2.3 pt=2 ot=3",
            "req=\"1.2.3\" is not a decimal number (digits, at most one '.')",
        ),
        (
            "v1 req=+1 pt=2 ot=3",
            "req=\"+1\" is not a decimal number (digits, at most one '.')",
        ),
        (
            "v1 req=0.0001 pt=2 ot=3",
            "req=\"0.0001\" has more than 3 decimals",
        ),
        (
            "v1 req=1000000000.001 pt=0 ot=0",
            "req=\"1000000000.001\" is above 1000000000 per second",
        ),
        (
            "v1 req=99999999999999999999999 pt=0 ot=0",
            "req=\"99999999999999999999999\" is above 1000000000 per second",
        ),
        (
            "v1 req= pt=0 ot=0",
            "req=\"\" is not a decimal number (digits, at most one '.')",
        ),
        ("v1 pt=0 ot=0", "no req="),
        ("v1 req=1 ot=0", "no pt="),
        ("v1 req=1 pt=0", "no ot="),
        ("v2 req=1 pt=0 ot=0", "not a v1 value"),
        ("window=1000 req=1 ptok=0 otok=0", "not a v1 value"),
    ];
    for (value, why) in cases {
        assert_eq!(
            usage("usage:team", value),
            Err(FactError::Malformed {
                key: "usage:team".into(),
                why: why.to_string()
            }),
            "{value}"
        );
    }
    for tenant in ["", "has space", "a=b", "ünïcode", &"t".repeat(65)] {
        assert!(
            matches!(
                usage(&format!("usage:{tenant}"), "v1 req=1 pt=1 ot=1"),
                Err(FactError::Invalid {
                    what: "tenant name",
                    ..
                })
            ),
            "{tenant:?}"
        );
        let fact = Fact::Usage {
            tenant: tenant.to_string(),
            usage: UsageFact::default(),
        };
        assert!(fact.value().is_err(), "{tenant:?}");
    }
}

#[test]
fn a_load_fact_reads_back_and_bad_ones_are_refused_with_their_reason() {
    let fact = Fact::Load {
        pod: "10.0.0.7:8000".into(),
        load: LoadFact {
            running: 12,
            waiting: 3,
            kv_permille: 815,
        },
    };
    assert_eq!(fact.key(), "load:10.0.0.7:8000");
    let value = fact.value().expect("a valid pod id");
    assert_eq!(value, "v1 running=12 waiting=3 kv=815");
    assert_eq!(Fact::parse(&fact.key(), &value), Ok(fact));
    // The longest value.
    let max = Fact::Load {
        pod: "p".into(),
        load: LoadFact {
            running: u32::MAX,
            waiting: u32::MAX,
            kv_permille: MAX_KV_PERMILLE,
        },
    };
    assert_eq!(
        max.value().as_deref(),
        Ok("v1 running=4294967295 waiting=4294967295 kv=1000")
    );
    let why = |value: &str| match Fact::parse("load:p", value) {
        Err(FactError::Malformed { why, .. }) => why,
        other => panic!("{value:?} read as {other:?}"),
    };
    assert_eq!(
        why("v1 running=1 waiting=2 kv=1001"),
        "kv= is above 1000 (permille)"
    );
    assert_eq!(
        why("v1 running=-1 waiting=2 kv=3"),
        "running=\"-1\" is not a number"
    );
    assert_eq!(why("v1 running=1 kv=3"), "no waiting=");
    assert_eq!(why("running=1 waiting=2 kv=3"), "not a v1 value");
}

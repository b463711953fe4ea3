//! A stream's codec: what it is ([`Compression`]) and the one function that chooses it
//! ([`choose_codec`]). The loader, `pushdown run`, the planner's estimates, plans for other
//! readers and the server's default for plain clients all call it, so "why was this stream
//! zstd?" is answered here: by what was forced, what is known of the link, and what the
//! server's profile measured.

/// The codec of a stream's Arrow IPC bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    None,
    #[default]
    Zstd,
    Lz4,
    /// Each batch's codec chosen by the server from where the stream waits: compressed while
    /// the socket holds the stream back, uncompressed while the server's CPU does.
    Adaptive,
}

impl Compression {
    /// The codec's name, as `FromStr` takes it and metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Zstd => "zstd",
            Self::Lz4 => "lz4",
            Self::Adaptive => "adaptive",
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    /// `none`, `zstd`, `lz4` or `adaptive`, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "zstd" => Ok(Self::Zstd),
            "lz4" => Ok(Self::Lz4),
            "adaptive" => Ok(Self::Adaptive),
            other => Err(format!(
                "unknown compression `{other}` (none, zstd, lz4 or adaptive)"
            )),
        }
    }
}

/// What is known of the link a stream crosses when its codec is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinkKnown {
    /// Both ends on one host: compressing only costs both sides CPU.
    Local,
    /// A bandwidth given by the user, in bytes per second.
    Given(f64),
    /// Not known: the server measures where the stream waits as it sends.
    Unknown,
}

/// What the server's profile of the stream's rows says about compressing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profiled {
    /// Nothing was profiled (SQL, a placement the user forced, a profile of no rows).
    #[default]
    No,
    /// Each codec's ratio and CPU were measured, and the cost model found this one the
    /// fastest once both ends' CPU and the link's bytes are counted.
    Measured(Compression),
    /// The codecs were not measured (an older server), but the estimate says whether the
    /// link bounds the stream.
    LinkBound(bool),
}

/// Everything a stream's codec is chosen from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodecInputs {
    /// A codec the user named (`compression=`, `--plain-client-codec`): it is the answer.
    pub forced: Option<Compression>,
    pub link: LinkKnown,
    pub profiled: Profiled,
}

/// Links slower than this are slower than zstd on one core: it can only help. Faster links
/// get LZ4, which compresses several times faster for a little less.
const ZSTD_MAX_LINK_BYTES_PER_S: f64 = 2.5e9 / 8.0;

/// The codec of a stream, the one place it is chosen:
///
/// 1. a codec the user forced;
/// 2. on one host, none;
/// 3. over a link nobody measured, [`Compression::Adaptive`] (the server's governor picks
///    each batch's codec from where the stream waits);
/// 4. over a given link: the profile's measured choice; none when the profile says the link
///    does not bound the stream (the CPU is better spent on the rows); otherwise, or with no
///    profile, by the link's speed: zstd up to 2.5 Gbit/s, LZ4 above, none when unlimited.
pub fn choose_codec(inputs: CodecInputs) -> Compression {
    if let Some(forced) = inputs.forced {
        return forced;
    }
    match (inputs.link, inputs.profiled) {
        (LinkKnown::Local, _) => Compression::None,
        (LinkKnown::Unknown, _) => Compression::Adaptive,
        (LinkKnown::Given(_), Profiled::Measured(codec)) => codec,
        (LinkKnown::Given(_), Profiled::LinkBound(false)) => Compression::None,
        (LinkKnown::Given(b), Profiled::LinkBound(true) | Profiled::No) => {
            if !b.is_finite() {
                Compression::None
            } else if b <= ZSTD_MAX_LINK_BYTES_PER_S {
                Compression::Zstd
            } else {
                Compression::Lz4
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(bytes_per_s: f64, profiled: Profiled) -> Compression {
        choose_codec(CodecInputs {
            forced: None,
            link: LinkKnown::Given(bytes_per_s),
            profiled,
        })
    }

    #[test]
    fn forced_wins_then_the_link_then_the_profile() {
        let gbit = 1e9 / 8.0;
        for link in [LinkKnown::Local, LinkKnown::Unknown, LinkKnown::Given(gbit)] {
            let forced = CodecInputs {
                forced: Some(Compression::Lz4),
                link,
                profiled: Profiled::Measured(Compression::None),
            };
            assert_eq!(choose_codec(forced), Compression::Lz4);
        }
        for profiled in [
            Profiled::No,
            Profiled::Measured(Compression::Zstd),
            Profiled::LinkBound(true),
        ] {
            let on = |link| {
                choose_codec(CodecInputs {
                    forced: None,
                    link,
                    profiled,
                })
            };
            assert_eq!(on(LinkKnown::Local), Compression::None);
            assert_eq!(on(LinkKnown::Unknown), Compression::Adaptive);
        }
        assert_eq!(
            given(gbit, Profiled::Measured(Compression::Lz4)),
            Compression::Lz4
        );
        assert_eq!(given(gbit, Profiled::LinkBound(false)), Compression::None);
        assert_eq!(given(gbit, Profiled::LinkBound(true)), Compression::Zstd);
        assert_eq!(given(gbit, Profiled::No), Compression::Zstd);
        assert_eq!(given(10.0 * gbit, Profiled::No), Compression::Lz4);
        assert_eq!(given(f64::INFINITY, Profiled::No), Compression::None);
    }

    #[test]
    fn names_round_trip() {
        for c in [
            Compression::None,
            Compression::Zstd,
            Compression::Lz4,
            Compression::Adaptive,
        ] {
            assert_eq!(c.to_string().parse::<Compression>(), Ok(c));
        }
        assert!("gzip".parse::<Compression>().is_err());
    }
}

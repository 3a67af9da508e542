//! Just enough of RESP, Redis's protocol, for the kit to talk to a server.

use std::io::BufRead;

/// A reply in the Redis protocol (RESP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Int(i64),
    /// `$3 abc`, or `$-1` (nil).
    Bulk(Option<Vec<u8>>),
    /// `*2 ...`, or `*-1` (nil).
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text, for simple and bulk strings.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Resp::Simple(s) => Some(s),
            Resp::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The reply as an integer (integers, and strings holding one).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Resp::Int(i) => Some(*i),
            other => other.as_str()?.trim().parse().ok(),
        }
    }

    /// Whether this is nil (`$-1` or `*-1`).
    pub fn is_nil(&self) -> bool {
        matches!(self, Resp::Bulk(None) | Resp::Array(None))
    }
}

/// Encode a command as a RESP array of bulk strings.
pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

pub(super) fn read_reply(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad RESP reply");
    let (tag, rest) = line.split_at(1.min(line.len()));
    Ok(match tag {
        "+" => Resp::Simple(rest.to_string()),
        "-" => Resp::Error(rest.to_string()),
        ":" => Resp::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Resp::Bulk(None)
            } else {
                let mut buf = vec![0u8; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Resp::Bulk(Some(buf))
            }
        }
        "*" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Resp::Array(None)
            } else {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(read_reply(r)?);
                }
                Resp::Array(Some(items))
            }
        }
        _ => return Err(bad()),
    })
}

//! The one parser of `--device` specs: `cpu`, `cuda` (ranks from GPU 0) or `cuda:N`
//! (ranks from GPU N).

use candle_core::Device;

use crate::error::{DistributedError, Error, Result};

/// A parsed `--device` spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// Every rank on the CPU.
    Cpu,
    /// Rank `r` on GPU `first + r`.
    Cuda {
        /// The GPU of rank 0.
        first: usize,
    },
}

impl DeviceSpec {
    /// Parses `cpu`, `cuda` or `cuda:N`.
    pub fn parse(spec: &str) -> Result<Self> {
        match spec {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda { first: 0 }),
            _ => match spec.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(first)) => Ok(Self::Cuda { first }),
                _ => Err(Error::Distributed(DistributedError::Device {
                    spec: spec.into(),
                    reason: "expected `cpu`, `cuda` or `cuda:N`".into(),
                    source: None,
                })),
            },
        }
    }

    /// Whether the ranks run on GPUs.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Self::Cuda { .. })
    }

    /// The GPU ordinals of `count` ranks; an error for `cpu`.
    #[cfg(any(test, feature = "internals", feature = "nccl"))]
    pub fn cuda_ordinals(&self, count: usize) -> Result<Vec<usize>> {
        match *self {
            Self::Cuda { first } => Ok((first..first + count).collect()),
            Self::Cpu => Err(Error::Distributed(DistributedError::Device {
                spec: "cpu".into(),
                reason: "expected `cuda` or `cuda:N` for GPU ranks".into(),
                source: None,
            })),
        }
    }

    /// The device of `rank`.
    pub fn open(&self, rank: usize) -> Result<Device> {
        match *self {
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda { first } => {
                let ordinal = first + rank;
                Device::new_cuda(ordinal).map_err(|e| {
                    Error::Distributed(DistributedError::Device {
                        spec: format!("cuda:{ordinal}"),
                        reason: "cannot be opened".into(),
                        source: Some(e.into()),
                    })
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_and_refuses_the_rest() {
        assert_eq!(DeviceSpec::parse("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(
            DeviceSpec::parse("cuda").unwrap(),
            DeviceSpec::Cuda { first: 0 }
        );
        assert_eq!(
            DeviceSpec::parse("cuda:4")
                .unwrap()
                .cuda_ordinals(2)
                .unwrap(),
            vec![4, 5]
        );
        for bad in ["cuda:", "cuda:x", "gpu", "CPU"] {
            assert!(
                matches!(
                    DeviceSpec::parse(bad),
                    Err(Error::Distributed(DistributedError::Device { .. }))
                ),
                "{bad}"
            );
        }
        assert!(DeviceSpec::Cpu.cuda_ordinals(1).is_err());
        assert!(matches!(DeviceSpec::Cpu.open(3), Ok(Device::Cpu)));
    }
}

//! How long the run lasts and where it trains: `RunLengthArgs` and `LaunchArgs`
//! check and resolve themselves.

use crate::config::args::{LaunchArgs, RunLengthArgs};
use crate::data::planner::RunLength;
use crate::dist::device_spec::DeviceSpec;
use crate::error::{Error, Result, SettingsError};

use super::require;

impl RunLengthArgs {
    /// A length of at least one step, given one way.
    pub(super) fn check(&self) -> Result<()> {
        require(self.max_steps != Some(0), "max_steps", 0, "at least 1")?;
        require(
            self.max_train_tokens != Some(0),
            "max_train_tokens",
            0,
            "at least 1",
        )?;
        if self.max_steps.is_some() && self.max_train_tokens.is_some() {
            return Err(Error::Settings(SettingsError::ConflictingSettings {
                first: "--max-steps",
                second: "--max-train-tokens",
                reason: "a run ends after a number of steps or of tokens: keep one",
            }));
        }
        if self.num_train_epochs == 0 && self.max_steps.is_none() && self.max_train_tokens.is_none()
        {
            return Err(Error::Settings(SettingsError::ZeroEpochs));
        }
        Ok(())
    }

    /// `--max-train-tokens`, else `--max-steps`, else epochs.
    pub(super) fn run_length(&self) -> RunLength {
        match (self.max_train_tokens, self.max_steps) {
            (Some(tokens), _) => RunLength::Tokens(tokens),
            (None, Some(steps)) => RunLength::Steps(steps),
            (None, None) => RunLength::Epochs(self.num_train_epochs),
        }
    }
}

impl LaunchArgs {
    /// A device the build knows.
    pub(super) fn device(&self) -> Result<DeviceSpec> {
        DeviceSpec::parse(&self.device)
    }
}

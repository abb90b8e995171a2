//! What a run returns, and the figures printed from it: each domain's last
//! validation loss, their mean and worst.

/// A run's summary and its domains' names, in order.
pub struct Outcome {
    pub summary: adabatch::TrainSummary,
    pub names: Vec<String>,
}

/// The last evaluation's figures: each domain's validation loss (nats per token,
/// in the order of the names), their mean and worst, and the loss over all
/// validation tokens.
pub struct FinalLosses {
    pub losses: Vec<f64>,
    pub mean: f64,
    pub worst: f64,
    pub eval_loss: f64,
}

impl Outcome {
    /// Prints the summary, each domain's validation loss and perplexity, their
    /// mean and worst; returns those figures (none without an evaluation).
    pub fn report(&self) -> Option<FinalLosses> {
        println!("{}", self.summary);
        let last = self.final_losses()?;
        for (name, loss) in self.names.iter().zip(&last.losses) {
            println!(
                "{name:>12}: validation loss {loss:.4} nats per token, perplexity {:.1}",
                loss.exp()
            );
        }
        println!(
            "mean over the domains {:.4}, worst {:.4}; all validation tokens {:.4}",
            last.mean, last.worst, last.eval_loss
        );
        Some(last)
    }

    /// The last evaluation's figures, if the run evaluated.
    fn final_losses(&self) -> Option<FinalLosses> {
        let last = self.summary.final_eval()?;
        let losses: Vec<f64> = (self.names.iter())
            .map(|n| last.get(&format!("eval_{n}_loss")).unwrap_or(f64::NAN))
            .collect();
        let mean = losses.iter().sum::<f64>() / losses.len() as f64;
        let worst = losses.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(FinalLosses {
            losses,
            mean,
            worst,
            eval_loss: last.eval_loss,
        })
    }
}

//! `gpu_check nccl`: the NCCL communicator at world size 1 (values, dtypes, flags,
//! broadcast, typed errors), the time of one all-reduce, and training through
//! `Run::group` with the NCCL member against the plain CUDA run. Needs the `nccl`
//! feature; without it the subcommand is an error.

use clap::Args;

#[derive(Args)]
pub struct NcclOpts {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Elements of the all-reduce timing buffer (default: the bench model's size).
    #[arg(long, default_value_t = 1_711_874)]
    timing_elems: usize,
    /// All-reduce calls timed.
    #[arg(long, default_value_t = 50)]
    timing_iters: usize,
}

#[cfg(not(feature = "nccl"))]
pub fn run(_: &NcclOpts) -> super::AnyResult<bool> {
    Err("this binary was built without the `nccl` feature".into())
}

#[cfg(feature = "nccl")]
pub use with_nccl::run;

/// The checks, compiled with the `nccl` feature only.
#[cfg(feature = "nccl")]
mod with_nccl {
    use std::time::Instant;

    use adabatch::{Communicator, Nccl, TrainingArgs};
    use candle_core::{DType, Device, Tensor};
    use serde_json::json;

    use super::super::replay_model::{collate, dataset, factory};
    use super::super::{cuda_device, emit, AnyResult};
    use super::NcclOpts;

    fn values(t: &Tensor) -> AnyResult<Vec<f64>> {
        Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
    }

    /// The checks on one rank of a world-1 group; returns (name, ok, detail) rows.
    pub fn checks(comm: &Nccl, device: &Device) -> AnyResult<Vec<(String, bool, String)>> {
        let mut rows = Vec::new();
        let mut row =
            |name: &str, ok: bool, detail: String| rows.push((name.to_string(), ok, detail));
        row(
            "rank_world",
            comm.rank() == 0 && comm.world_size() == 1,
            format!("rank {} of {}", comm.rank(), comm.world_size()),
        );

        // all-reduce: f32 matrix, bf16 vector, f64 vector, scalars.
        let a = Tensor::arange(0f32, 6.0, device)?.reshape((2, 3))?;
        let b = Tensor::new(&[1.5f32, -2.25, 3.0, 1024.0], device)?.to_dtype(DType::BF16)?;
        let c = Tensor::new(&[1e-12f64, 123456789.125], device)?;
        let originals = [a.clone(), b.clone(), c.clone()];
        let mut tensors = originals.to_vec();
        let mut scalars = [0.5, 7.0, -3.25];
        comm.all_reduce_sum(&mut tensors, &mut scalars)?;
        let mut same = true;
        let mut detail = String::new();
        for (i, (t, o)) in tensors.iter().zip(&originals).enumerate() {
            let kept = t.dims() == o.dims()
                && t.dtype() == o.dtype()
                && t.device().location() == o.device().location();
            let equal = values(t)? == values(o)?;
            if !(kept && equal) {
                same = false;
                detail.push_str(&format!(
                    "tensor {i}: shape/dtype/device kept {kept}, values equal {equal}; "
                ));
            }
        }
        let scalars_ok = scalars == [0.5, 7.0, -3.25];
        if !scalars_ok {
            detail.push_str(&format!("scalars {scalars:?}; "));
        }
        row("all_reduce_sum_identity", same && scalars_ok, detail);

        // The result is usable by later kernels on the same stream.
        let doubled = values(&(&tensors[0] * 2.0)?)?;
        row(
            "result_usable",
            doubled == vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0],
            format!("{doubled:?}"),
        );

        // Flags and barrier.
        let t = comm.any(true)?;
        let f = comm.any(false)?;
        row("any", t && !f, format!("any(true) = {t}, any(false) = {f}"));
        row("barrier", comm.barrier().is_ok(), String::new());

        // Broadcast from rank 0 keeps the values; a bad root is an error.
        let mut weights = vec![
            Tensor::randn(0f32, 1.0, (64, 32), device)?,
            Tensor::randn(0f32, 1.0, 32, device)?,
        ];
        let before: Vec<Vec<f64>> = weights.iter().map(values).collect::<AnyResult<_>>()?;
        comm.broadcast(&mut weights, 0)?;
        let after: Vec<Vec<f64>> = weights.iter().map(values).collect::<AnyResult<_>>()?;
        row("broadcast_root0", before == after, String::new());
        let bad_root = comm.broadcast(&mut weights, 1);
        row(
            "broadcast_bad_root_is_error",
            matches!(
                bad_root,
                Err(adabatch::Error::Distributed(
                    adabatch::DistributedError::CollectiveInput { .. }
                ))
            ),
            format!("{bad_root:?}"),
        );

        // A CPU tensor is refused with a typed error.
        let mut cpu = [Tensor::new(&[1f32], &Device::Cpu)?];
        let refused = comm.all_reduce_sum(&mut cpu, &mut []);
        row(
            "cpu_tensor_refused",
            matches!(
                refused,
                Err(adabatch::Error::Distributed(
                    adabatch::DistributedError::CollectiveInput { .. }
                ))
            ),
            format!("{refused:?}"),
        );
        Ok(rows)
    }

    pub fn run(opts: &NcclOpts) -> AnyResult<bool> {
        let mut ok = true;
        let mut report = |name: &str, pass: bool, detail: &str| {
            ok &= pass;
            emit(&json!({"check": format!("nccl.{name}"), "ok": pass, "detail": detail}));
        };
        eprintln!("nccl: creating a world-1 communicator on cuda:{}", opts.gpu);
        let mut members = Nccl::group_on(&[opts.gpu])?;
        let (comm, device) = members.remove(0);
        for (name, pass, detail) in checks(&comm, &device)? {
            report(&name, pass, &detail);
        }

        // Timing of one all-reduce of `timing_elems` f32 (pack + NCCL + unpack).
        let mut grads = vec![Tensor::ones(opts.timing_elems, DType::F32, &device)?];
        let mut scalars = [1.0, 2.0, 0.0, 0.0];
        comm.all_reduce_sum(&mut grads, &mut scalars)?;
        let started = Instant::now();
        for _ in 0..opts.timing_iters {
            comm.all_reduce_sum(&mut grads, &mut scalars)?;
        }
        device.synchronize()?;
        let per_call = started.elapsed().as_secs_f64() / opts.timing_iters.max(1) as f64;
        emit(&json!({
            "check": "nccl.timing",
            "ok": true,
            "elems": opts.timing_elems,
            "bytes": opts.timing_elems * 4,
            "us_per_all_reduce_world1": per_call * 1e6,
            "note": "world size 1: measures flatten/cat, NCCL launch, scalar read-back; no inter-GPU traffic",
        }));

        // Training through Run::group with the NCCL member (the factory's
        // agreement all-reduce runs through NCCL) equals the plain CUDA run.
        let data = dataset(10, 42);
        let args = {
            let mut args = TrainingArgs::default();
            args.data.seed = Some(42);
            args.length.num_train_epochs = 5;
            args.batch.per_device_train_batch_size = 1;
            args.lr.learning_rate = 0.01;
            args.logging.quiet = true;
            args.launch.device = format!("cuda:{}", opts.gpu);
            args
        };
        let plain = adabatch::Run::new(&data, &collate, &args)
            .launch(factory(adabatch::ParamsAdamW {
                lr: 0.01,
                ..Default::default()
            }))?
            .summary;
        let via_nccl = adabatch::Run::new(&data, &collate, &args)
            .group(
                vec![(comm, device.clone())],
                factory(adabatch::ParamsAdamW {
                    lr: 0.01,
                    ..Default::default()
                }),
            )?
            .summary;
        let same =
            plain.step_losses == via_nccl.step_losses && plain.global_step == via_nccl.global_step;
        report(
            "launch_group_world1",
            same,
            &format!("{} steps, losses identical: {same}", via_nccl.global_step),
        );

        // Informational (does not fail the run; the engine gives NCCL ranks their
        // own stream): does NCCL accept candle's per-thread default stream?
        let per_thread = cuda_device(opts.gpu)?;
        let (works, detail) = match Nccl::group(std::slice::from_ref(&per_thread)) {
            Ok(mut g) => {
                let comm = g.remove(0);
                let mut t = [Tensor::new(&[1f32, 2.0], &per_thread)?];
                let r = comm.all_reduce_sum(&mut t, &mut [1.0]);
                (
                    r.is_ok() && values(&t[0])? == vec![1.0, 2.0],
                    format!("{r:?}"),
                )
            }
            Err(e) => (false, e.to_string()),
        };
        emit(&json!({
            "check": "nccl.per_thread_stream_device",
            "ok": true,
            "informational": true,
            "works": works,
            "detail": detail,
        }));
        Ok(ok)
    }
}

//! `gpu_check breakdown`: the time of a step split into host (sampling, collate,
//! copy), forward, backward, all-reduce and optimizer, by a hand-written loop that
//! synchronises the device between sections (one rank; NCCL at world size 1 when
//! built with `nccl`).

use std::time::Instant;

use adabatch::{Communicator, Parameters, TrainModel};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use candle_nn::Optimizer;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::bench::{set_tf32, BenchOpts};
use super::transformer::{self, Example, Transformer};
use super::{emit, parse_device, AnyResult};

/// Mean seconds per section.
#[derive(Default)]
struct Split {
    host: f64,
    forward: f64,
    backward: f64,
    all_reduce: f64,
    optimizer: f64,
}

pub fn run(opts: &BenchOpts) -> AnyResult<bool> {
    set_tf32(opts.tf32);
    let data = transformer::load(&opts.data, opts.model.max_len)?;
    let device = parse_device(&opts.device)?;
    #[cfg(feature = "nccl")]
    let (comm, device): (Box<dyn Communicator>, Device) = if device.is_cuda() {
        let ordinal = match device.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
            _ => 0,
        };
        let (comm, dev) = adabatch::Nccl::group_on(&[ordinal])?.remove(0);
        (Box::new(comm), dev)
    } else {
        (Box::new(adabatch::Single), device)
    };
    #[cfg(not(feature = "nccl"))]
    let comm: Box<dyn Communicator> = Box::new(adabatch::Single);
    let comm_name = if comm.world_size() == 1 && device.is_cuda() && cfg!(feature = "nccl") {
        "nccl (world 1)"
    } else {
        "single (no-op)"
    };
    let model = Transformer::new(opts.model, Parameters::new(opts.seed), &device)?;
    let mut opt = transformer::optimizer(&model, opts.learning_rate)?;
    let params = model.named_parameters();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed);
    let mut order: Vec<usize> = (0..data.len()).collect();
    let mut cursor = data.len();
    let mut split = Split::default();
    let mut examples = 0usize;
    let total = opts.warmup_steps + opts.steps;
    let sync = || device.synchronize();
    let mut timed_wall = 0.0;
    for step in 1..=total {
        let size = (opts.per_device_train_batch_size
            + transformer::GROW * ((step - 1) / transformer::EVERY))
            .min(transformer::MAX_BATCH);
        let timed = step > opts.warmup_steps;
        sync()?;
        let t0 = Instant::now();
        // host: pick examples, collate, copy to the device.
        if cursor + size > order.len() {
            for i in (1..order.len()).rev() {
                order.swap(i, rng.random_range(0..=i));
            }
            cursor = 0;
        }
        let items: Vec<Example> = order[cursor..cursor + size.min(order.len())]
            .iter()
            .map(|&i| data[i].clone())
            .collect();
        cursor += items.len();
        let batch = transformer::collate(&items, &device)?;
        sync()?;
        let t1 = Instant::now();
        let losses = model.per_example_loss(&batch)?;
        let loss = (losses.sum_all()? / items.len() as f64)?;
        let loss_value = loss.to_scalar::<f32>()?;
        sync()?;
        let t2 = Instant::now();
        let grads = loss.backward()?;
        sync()?;
        let t3 = Instant::now();
        let mut tensors: Vec<Tensor> = params
            .iter()
            .map(|(_, v)| {
                grads
                    .get(v.as_tensor())
                    .cloned()
                    .map_or_else(|| v.as_tensor().zeros_like(), Ok)
            })
            .collect::<candle_core::Result<_>>()?;
        let mut scalars = [f64::from(loss_value), items.len() as f64, 0.0, 0.0];
        comm.all_reduce_sum(&mut tensors, &mut scalars)?;
        sync()?;
        let t4 = Instant::now();
        let mut store = GradStore::default();
        for ((_, var), g) in params.iter().zip(tensors) {
            store.insert(var.as_tensor(), g);
        }
        opt.step(&store)?;
        sync()?;
        let t5 = Instant::now();
        if timed {
            split.host += (t1 - t0).as_secs_f64();
            split.forward += (t2 - t1).as_secs_f64();
            split.backward += (t3 - t2).as_secs_f64();
            split.all_reduce += (t4 - t3).as_secs_f64();
            split.optimizer += (t5 - t4).as_secs_f64();
            timed_wall += (t5 - t0).as_secs_f64();
            examples += items.len();
        }
        if !loss_value.is_finite() {
            return Err(format!("loss is {loss_value} at step {step}").into());
        }
    }
    let n = opts.steps.max(1) as f64;
    let ms = |s: f64| s / n * 1e3;
    let frac = |s: f64| s / timed_wall.max(f64::MIN_POSITIVE);
    emit(&json!({
        "breakdown": "transformer_classifier",
        "device": opts.device,
        "communicator": comm_name,
        "steps": opts.steps,
        "samples_per_s_with_syncs": examples as f64 / timed_wall.max(f64::MIN_POSITIVE),
        "ms_per_step": {
            "host_collate_and_copy": ms(split.host),
            "forward": ms(split.forward),
            "backward": ms(split.backward),
            "all_reduce": ms(split.all_reduce),
            "optimizer": ms(split.optimizer),
            "total": ms(timed_wall),
        },
        "fraction": {
            "host_collate_and_copy": frac(split.host),
            "forward": frac(split.forward),
            "backward": frac(split.backward),
            "all_reduce": frac(split.all_reduce),
            "optimizer": frac(split.optimizer),
        },
        "note": "device synchronised between sections (so the sum exceeds an unsynchronised step); forward includes reading the loss back",
    }));
    Ok(true)
}

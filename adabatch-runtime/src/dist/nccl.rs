//! [`Nccl`]: the communicator for NVIDIA GPUs (feature `nccl`), one rank per GPU.
//!
//! - One node: [`Nccl::group_on`] (or [`Nccl::group`]) creates one communicator per
//!   GPU in this process (`ncclCommInitAll`); the engine runs one thread per GPU.
//! - Several nodes: [`Nccl::from_env`] reads torchrun's `RANK`, `WORLD_SIZE`,
//!   `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`; process 0 makes
//!   the NCCL unique id and hands it to the others over the TCP rendezvous of
//!   [`crate::dist::rendezvous`], then every rank calls `ncclCommInitRank`.
//!
//! Collectives run on the device: the tensors of a call are flattened and
//! concatenated into one contiguous CUDA buffer (f32, or f64 when a tensor is
//! f64 or an integer type), all-reduced by NCCL into a second buffer on the
//! device's stream, and handed back as views (`narrow` + `reshape`) of that
//! buffer — no host round trip. The `f64` scalars (loss, token count, agreement
//! flags) travel in a small device buffer in the same NCCL group; reading them
//! back is the only host synchronisation of a step. While waiting, the rank polls
//! the stream, NCCL's asynchronous error, the group's abort flag and a timeout, so
//! a failed peer in this process (or a dead remote one, after the timeout) does
//! not hang the others forever: the communicator is aborted and the call returns
//! an error.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, DeviceLocation, Storage, Tensor};
use cudarc::driver::{sys as cu, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use cudarc::nccl::{result as nccl, sys as nccl_sys, NcclType};

use crate::dist::communicator::Communicator;
use crate::dist::rendezvous::{self, RendezvousError, TorchrunEnv};
use crate::error::{DistributedError, Error, Result, SettingsError};

/// How long a rank waits for a collective before it declares the group broken.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the processes wait for each other at start-up.
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// A raw NCCL communicator. NCCL communicators may be used from any thread, one
/// call at a time; the mutex provides the one-at-a-time.
struct CommPtr(nccl_sys::ncclComm_t);
// SAFETY: an ncclComm_t is a handle NCCL lets any thread use; access is serialised
// by the `Mutex` in `RawComm`.
unsafe impl Send for CommPtr {}

struct RawComm {
    comm: Mutex<CommPtr>,
    /// The same handle, for `abort` alone: a collective stuck inside NCCL (e.g. in
    /// `ncclGroupEnd` waiting for a dead peer) holds the mutex, and
    /// `ncclCommAbort` is meant to be called from another thread to free it.
    abort_handle: AtomicPtr<nccl_sys::ncclComm>,
    aborted: AtomicBool,
}

impl RawComm {
    fn lock(&self) -> MutexGuard<'_, CommPtr> {
        self.comm.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `ncclCommAbort` (once), without waiting for the mutex: pending operations
    /// of this rank stop, a call blocked inside NCCL returns.
    fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            let comm = self.abort_handle.load(Ordering::SeqCst);
            // SAFETY: a communicator created by NCCL and not yet destroyed (only
            // `Drop` destroys it, and not once `aborted` is set); every later use
            // checks `aborted` under the mutex first, and NCCL allows the abort
            // while another thread is inside a call on the communicator.
            let _ = unsafe { nccl::comm_abort(comm) };
        }
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        if !self.aborted.load(Ordering::SeqCst) {
            let comm = self.comm.get_mut().unwrap_or_else(|e| e.into_inner()).0;
            // SAFETY: the last owner of a live communicator.
            let _ = unsafe { nccl::comm_destroy(comm) };
        }
    }
}

/// State shared by the ranks of one process.
#[derive(Default)]
struct Shared {
    aborted: AtomicBool,
}

/// One rank of an NCCL group, bound to one GPU.
pub struct Nccl {
    rank: usize,
    world_size: usize,
    device: Device,
    comm: RawComm,
    shared: Arc<Shared>,
    timeout: Duration,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("device", &self.device.location())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What NCCL answered: its `ncclResult_t` and its own last message. cudarc's
/// error is no `std::error::Error` (and prints as a bare type name), so this is
/// the typed cause a failed call keeps as its `source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclFailure {
    /// The `ncclResult_t`, as NCCL names it (`ncclUnhandledCudaError`, ...).
    pub result: String,
    /// `ncclGetLastError`'s message, where NCCL left one.
    pub last_error: Option<String>,
}

impl std::fmt::Display for NcclFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.last_error {
            Some(last) => write!(f, "{} ({last})", self.result),
            None => f.write_str(&self.result),
        }
    }
}

impl std::error::Error for NcclFailure {}

/// A failed NCCL call `what`, its [`NcclFailure`] as the source.
fn nccl_err(what: &str) -> impl FnOnce(nccl::NcclError) -> Error + '_ {
    move |e| {
        // SAFETY: a null communicator asks for the last error of any; NCCL returns a
        // static, NUL-terminated string (or null).
        let last = unsafe { nccl_sys::ncclGetLastError(std::ptr::null_mut()) };
        let last_error = (!last.is_null())
            .then(|| {
                // SAFETY: non-null, NUL-terminated, owned by NCCL.
                unsafe { std::ffi::CStr::from_ptr(last) }
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|text| !text.is_empty());
        Error::Distributed(DistributedError::Library {
            library: "NCCL",
            call: what.to_string(),
            detail: "failed".into(),
            source: Some(Box::new(NcclFailure {
                result: format!("{:?}", e.0),
                last_error,
            })),
        })
    }
}

fn cuda_err(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
    move |e| {
        Error::Distributed(DistributedError::Library {
            library: "CUDA",
            call: what.to_string(),
            detail: "failed".into(),
            source: Some(e.into()),
        })
    }
}

fn ordinal(device: &Device) -> Result<usize> {
    match device.location() {
        DeviceLocation::Cuda { gpu_id } => Ok(gpu_id),
        other => Err(Error::Distributed(DistributedError::Device {
            spec: format!("{other:?}"),
            reason: "the NCCL communicator needs CUDA devices".into(),
            source: None,
        })),
    }
}

/// A CUDA device with its own stream (NCCL and candle then share that stream).
fn open_device(ordinal: usize) -> Result<Device> {
    Device::new_cuda_with_stream(ordinal).map_err(|e| {
        Error::Distributed(DistributedError::Device {
            spec: format!("cuda:{ordinal}"),
            reason: "cannot be opened".into(),
            source: Some(e.into()),
        })
    })
}

fn check_distinct(ordinals: &[usize]) -> Result<()> {
    let mut seen = ordinals.to_vec();
    seen.sort_unstable();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::Distributed(DistributedError::Device {
            spec: format!("cuda:{}", w[0]),
            reason: "appears twice: NCCL needs one GPU per rank".into(),
            source: None,
        }));
    }
    Ok(())
}

impl Nccl {
    fn new(
        rank: usize,
        world_size: usize,
        device: Device,
        comm: nccl_sys::ncclComm_t,
        shared: Arc<Shared>,
    ) -> Self {
        Self {
            rank,
            world_size,
            device,
            comm: RawComm {
                comm: Mutex::new(CommPtr(comm)),
                abort_handle: AtomicPtr::new(comm),
                aborted: AtomicBool::new(false),
            },
            shared,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// One communicator per device, all in this process (`ncclCommInitAll`); rank
    /// `i` is `devices[i]`. Devices made with `Device::new_cuda_with_stream` are
    /// preferred (see [`Nccl::group_on`]).
    pub fn group(devices: &[Device]) -> Result<Vec<Nccl>> {
        if devices.is_empty() {
            return Err(Error::Settings(SettingsError::EmptyGroup));
        }
        let ordinals = devices.iter().map(ordinal).collect::<Result<Vec<_>>>()?;
        check_distinct(&ordinals)?;
        let list: Vec<i32> = ordinals
            .iter()
            .map(|&o| {
                i32::try_from(o).map_err(|_| {
                    Error::Distributed(DistributedError::CollectiveInput {
                        detail: format!("GPU ordinal {o}"),
                    })
                })
            })
            .collect::<Result<_>>()?;
        let n = i32::try_from(devices.len()).map_err(|_| {
            Error::Distributed(DistributedError::CollectiveInput {
                detail: format!("{} devices", devices.len()),
            })
        })?;
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for `n` handles and `list` holds `n` ordinals.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), n, list.as_ptr()) }
            .map_err(nccl_err("ncclCommInitAll"))?;
        let shared = Arc::new(Shared::default());
        Ok(comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (comm, device))| {
                Nccl::new(
                    rank,
                    devices.len(),
                    device.clone(),
                    comm,
                    Arc::clone(&shared),
                )
            })
            .collect())
    }

    /// Opens `cuda:o` for every ordinal (each with its own stream) and creates their
    /// communicators: the members for [`Run::group`](crate::Run::group) on one node.
    pub fn group_on(ordinals: &[usize]) -> Result<Vec<(Nccl, Device)>> {
        check_distinct(ordinals)?;
        let devices = ordinals
            .iter()
            .map(|&o| open_device(o))
            .collect::<Result<Vec<_>>>()?;
        Ok(Nccl::group(&devices)?.into_iter().zip(devices).collect())
    }

    /// Several processes, as torchrun starts them: one rank per process on GPU
    /// `LOCAL_RANK`. See [`Nccl::from_env_with`].
    pub fn from_env() -> Result<Vec<(Nccl, Device)>> {
        Nccl::from_env_with(1, DEFAULT_RENDEZVOUS_TIMEOUT)
    }

    /// Several processes, each hosting `gpus_per_process` ranks (threads): process
    /// `RANK` holds global ranks `RANK * g .. RANK * g + g` on GPUs
    /// `LOCAL_RANK * g + i`; the world is `WORLD_SIZE * g`. With `g = 1` this is
    /// torchrun's one process per GPU; with one process per node, `g` is the
    /// node's GPU count. The processes meet at `MASTER_ADDR:MASTER_PORT` within
    /// `rendezvous_timeout`; a process that does not arrive is named in the error.
    pub fn from_env_with(
        gpus_per_process: usize,
        rendezvous_timeout: Duration,
    ) -> Result<Vec<(Nccl, Device)>> {
        let env = TorchrunEnv::from_env()?;
        Nccl::from_torchrun(&env, gpus_per_process, rendezvous_timeout)
    }

    /// [`Nccl::from_env_with`] from already-read variables.
    pub fn from_torchrun(
        env: &TorchrunEnv,
        gpus_per_process: usize,
        rendezvous_timeout: Duration,
    ) -> Result<Vec<(Nccl, Device)>> {
        let g = gpus_per_process;
        if g == 0 {
            return Err(Error::Settings(SettingsError::InvalidSetting {
                name: "gpus_per_process",
                value: "0".into(),
                expected: "at least 1",
            }));
        }
        let world = env.world_size * g;
        let ordinals: Vec<usize> = (env.local_rank * g..env.local_rank * g + g).collect();
        let devices = ordinals
            .iter()
            .map(|&o| open_device(o))
            .collect::<Result<Vec<_>>>()?;
        let fresh_id = || -> std::result::Result<Vec<u8>, RendezvousError> {
            let id = nccl::get_uniqueid()
                .map_err(|e| RendezvousError::Protocol(format!("ncclGetUniqueId: {:?}", e.0)))?;
            Ok(id.internal.iter().map(|&c| c as u8).collect())
        };
        // One process has nobody to meet: no listener, no port.
        let id = if env.world_size == 1 {
            fresh_id()?
        } else {
            rendezvous::exchange(&env.rendezvous(rendezvous_timeout), fresh_id)?
        };
        let id = unique_id(&id)?;
        let world_i32 = i32::try_from(world).map_err(|_| {
            Error::Distributed(DistributedError::CollectiveInput {
                detail: format!("world size {world}"),
            })
        })?;
        let mut comms = vec![std::ptr::null_mut(); g];
        nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let mut init = Ok(());
        for (i, device) in devices.iter().enumerate() {
            let rank = env.rank * g + i;
            let bound = cuda_device(device).and_then(|d| {
                d.cuda_stream()
                    .context()
                    .bind_to_thread()
                    .map_err(cuda_err("bind context"))
            });
            init = bound.and_then(|()| {
                // SAFETY: `comms[i]` is a valid out pointer; the id came from rank 0.
                unsafe { nccl::comm_init_rank(&mut comms[i], world_i32, id, rank as i32) }
                    .map(|_| ())
                    .map_err(nccl_err("ncclCommInitRank"))
            });
            if init.is_err() {
                break;
            }
        }
        let ended = nccl::group_end().map_err(nccl_err("ncclGroupEnd (communicator init)"));
        init?;
        ended?;
        let shared = Arc::new(Shared::default());
        Ok(comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(i, (comm, device))| {
                let rank = env.rank * g + i;
                (
                    Nccl::new(rank, world, device.clone(), comm, Arc::clone(&shared)),
                    device,
                )
            })
            .collect())
    }

    /// How long a collective may take before the group is declared broken
    /// (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The GPU of this rank.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn cuda(&self) -> Result<&CudaDevice> {
        cuda_device(&self.device)
    }

    fn check_alive(&self) -> Result<()> {
        if self.shared.aborted.load(Ordering::SeqCst) || self.comm.aborted.load(Ordering::SeqCst) {
            return Err(Error::Distributed(DistributedError::PeerFailed {
                rank: self.rank,
            }));
        }
        Ok(())
    }

    /// Waits for `stream` to drain, watching NCCL's asynchronous error, the
    /// group's abort flag and the timeout.
    fn wait(&self, stream: &CudaStream, what: &str) -> Result<()> {
        let started = Instant::now();
        let mut spins = 0u32;
        loop {
            // SAFETY: a live stream of this rank's context (bound by the caller).
            match unsafe { cu::cuStreamQuery(stream.cu_stream()) } {
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                e => {
                    self.abort_group();
                    return Err(Error::Distributed(DistributedError::Library {
                        library: "CUDA",
                        call: what.to_string(),
                        detail: format!("stream error {e:?}"),
                        source: None,
                    }));
                }
            }
            let mut async_err = nccl_sys::ncclResult_t::ncclSuccess;
            {
                let guard = self.comm.lock();
                if !self.comm.aborted.load(Ordering::SeqCst) {
                    // SAFETY: a live communicator; `async_err` is a valid out pointer.
                    let _ = unsafe { nccl_sys::ncclCommGetAsyncError(guard.0, &mut async_err) };
                }
            }
            if !matches!(
                async_err,
                nccl_sys::ncclResult_t::ncclSuccess | nccl_sys::ncclResult_t::ncclInProgress
            ) {
                self.abort_group();
                return Err(Error::Distributed(DistributedError::Library {
                    library: "NCCL",
                    call: what.to_string(),
                    detail: format!("reported {async_err:?} on rank {}", self.rank),
                    source: None,
                }));
            }
            if self.shared.aborted.load(Ordering::SeqCst) {
                self.comm.abort();
                return Err(Error::Distributed(DistributedError::PeerFailed {
                    rank: self.rank,
                }));
            }
            if started.elapsed() > self.timeout {
                self.abort_group();
                return Err(Error::Distributed(DistributedError::PeersTimedOut {
                    collective: what.to_string(),
                    rank: self.rank,
                    waited: self.timeout,
                }));
            }
            spins += 1;
            if spins < 200 {
                std::hint::spin_loop();
            } else if spins < 2_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn abort_group(&self) {
        self.shared.aborted.store(true, Ordering::SeqCst);
        self.comm.abort();
    }

    /// Runs `enqueue` (NCCL calls on `stream`) inside one NCCL group.
    fn grouped(&self, enqueue: impl FnOnce(nccl_sys::ncclComm_t) -> Result<()>) -> Result<()> {
        let guard = self.comm.lock();
        if self.comm.aborted.load(Ordering::SeqCst) {
            return Err(Error::Distributed(DistributedError::PeerFailed {
                rank: self.rank,
            }));
        }
        nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let enqueued = enqueue(guard.0);
        let ended = nccl::group_end()
            .map(|_| ())
            .map_err(nccl_err("ncclGroupEnd"));
        drop(guard);
        if enqueued.is_err() || ended.is_err() {
            self.abort_group();
        }
        enqueued.and(ended)
    }

    fn collective(
        &self,
        tensors: &mut [Tensor],
        scalars: &mut [f64],
        kind: Kind,
        what: &str,
    ) -> Result<()> {
        self.check_alive()?;
        let cuda = self.cuda()?.clone();
        let stream = cuda.cuda_stream();
        stream
            .context()
            .bind_to_thread()
            .map_err(cuda_err("bind context"))?;
        let packed = Packed::new(tensors, &self.device)?;
        let mut scalar_buf = if scalars.is_empty() {
            None
        } else {
            Some(
                stream
                    .clone_htod(scalars)
                    .map_err(cuda_err("copy scalars"))?,
            )
        };
        let out = match &packed {
            None => {
                if let Some(buf) = scalar_buf.as_mut() {
                    self.grouped(|comm| all_reduce_in_place(buf, &stream, comm))?;
                }
                None
            }
            Some(p) if p.dtype == DType::F64 => {
                Some(p.run::<f64>(self, &cuda, &stream, kind, scalar_buf.as_mut())?)
            }
            Some(p) => Some(p.run::<f32>(self, &cuda, &stream, kind, scalar_buf.as_mut())?),
        };
        if scalar_buf.is_some() || matches!(kind, Kind::Broadcast(_)) {
            self.wait(&stream, what)?;
        }
        if let Some(buf) = scalar_buf {
            let summed = stream.clone_dtoh(&buf).map_err(cuda_err("read scalars"))?;
            scalars.copy_from_slice(&summed);
        }
        if let (Some(p), Some(out)) = (packed, out) {
            p.unpack(&out, tensors)?;
        }
        Ok(())
    }
}

fn cuda_device(device: &Device) -> Result<&CudaDevice> {
    match device {
        Device::Cuda(d) => Ok(d),
        other => Err(Error::Distributed(DistributedError::Device {
            spec: format!("{:?}", other.location()),
            reason: "the NCCL communicator needs a CUDA device".into(),
            source: None,
        })),
    }
}

fn unique_id(bytes: &[u8]) -> Result<nccl_sys::ncclUniqueId> {
    let mut internal = [0 as std::ffi::c_char; 128];
    if bytes.len() != internal.len() {
        return Err(Error::Distributed(DistributedError::CollectiveInput {
            detail: format!(
                "the NCCL id from rank 0 has {} bytes, expected {}",
                bytes.len(),
                internal.len()
            ),
        }));
    }
    for (dst, &src) in internal.iter_mut().zip(bytes) {
        *dst = src as std::ffi::c_char;
    }
    Ok(nccl_sys::ncclUniqueId { internal })
}

fn all_reduce_in_place(
    buf: &mut cudarc::driver::CudaSlice<f64>,
    stream: &CudaStream,
    comm: nccl_sys::ncclComm_t,
) -> Result<()> {
    let n = buf.len();
    let (ptr, _record) = buf.device_ptr_mut(stream);
    // SAFETY: `ptr` holds `n` f64 on this rank's device, alive until the stream
    // passes the event `_record` records; NCCL allows in-place all-reduce.
    unsafe {
        nccl::all_reduce(
            ptr as *const _,
            ptr as *mut _,
            n,
            nccl_sys::ncclDataType_t::ncclFloat64,
            nccl_sys::ncclRedOp_t::ncclSum,
            comm,
            stream.cu_stream() as _,
        )
    }
    .map(|_| ())
    .map_err(nccl_err("all-reduce of scalars"))
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Sum,
    Broadcast(usize),
}

/// The tensors of one call, concatenated into one contiguous device buffer.
struct Packed {
    flat: Tensor,
    dtype: DType,
    /// `(elements, original dtype, shape)` of each tensor, in order.
    parts: Vec<(usize, DType, candle_core::Shape)>,
}

impl Packed {
    fn new(tensors: &[Tensor], device: &Device) -> Result<Option<Self>> {
        if tensors.is_empty() {
            return Ok(None);
        }
        let home = device.location();
        // The same candle device (one stream), not just the same GPU: a tensor of
        // another candle device on this GPU would be read unordered.
        let wide = tensors
            .iter()
            .any(|t| !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16));
        let dtype = if wide { DType::F64 } else { DType::F32 };
        let mut flats = Vec::with_capacity(tensors.len());
        let mut parts = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if !t.device().same_device(device) {
                return Err(Error::Distributed(DistributedError::CollectiveInput {
                    detail: format!(
                        "tensor {i} is on {:?} but this NCCL rank is on {home:?}",
                        t.device().location()
                    ),
                }));
            }
            parts.push((t.elem_count(), t.dtype(), t.shape().clone()));
            flats.push(t.flatten_all()?.to_dtype(dtype)?);
        }
        if parts.iter().all(|p| p.0 == 0) {
            return Ok(None);
        }
        let flat = Tensor::cat(&flats, 0)?.contiguous()?;
        Ok(Some(Self { flat, dtype, parts }))
    }

    /// Enqueues the collective of the flat buffer (and the scalars) in one NCCL
    /// group; returns the output buffer as a tensor.
    fn run<T>(
        &self,
        nccl: &Nccl,
        cuda: &CudaDevice,
        stream: &Arc<CudaStream>,
        kind: Kind,
        scalars: Option<&mut cudarc::driver::CudaSlice<f64>>,
    ) -> Result<Tensor>
    where
        T: CudaDType + NcclType + DeviceRepr,
    {
        let n = self.flat.elem_count();
        let (storage, layout) = self.flat.storage_and_layout();
        let Storage::Cuda(storage) = &*storage else {
            return Err(Error::Distributed(DistributedError::CollectiveInput {
                detail: "the packed buffer is not on CUDA".into(),
            }));
        };
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            Error::Distributed(DistributedError::CollectiveInput {
                detail: "the packed buffer is not contiguous".into(),
            })
        })?;
        let src = storage.as_cuda_slice::<T>()?.slice(start..end);
        // SAFETY: every element of `out` is written by the collective before use.
        let mut out = unsafe { stream.alloc::<T>(n) }.map_err(cuda_err("alloc"))?;
        nccl.grouped(|comm| {
            let (src_ptr, _src_record) = src.device_ptr(stream);
            let (dst_ptr, _dst_record) = out.device_ptr_mut(stream);
            // SAFETY: `src` and `out` hold `n` elements of `T` on this rank's device
            // and stay alive until the stream passes the recorded events.
            let status = unsafe {
                match kind {
                    Kind::Sum => nccl::all_reduce(
                        src_ptr as *const _,
                        dst_ptr as *mut _,
                        n,
                        T::as_nccl_type(),
                        nccl_sys::ncclRedOp_t::ncclSum,
                        comm,
                        stream.cu_stream() as _,
                    ),
                    Kind::Broadcast(root) => nccl::broadcast(
                        src_ptr as *const _,
                        dst_ptr as *mut _,
                        n,
                        T::as_nccl_type(),
                        root as i32,
                        comm,
                        stream.cu_stream() as _,
                    ),
                }
            };
            status.map_err(nccl_err("collective"))?;
            if let Some(buf) = scalars {
                all_reduce_in_place(buf, stream, comm)?;
            }
            Ok(())
        })?;
        let storage = CudaStorage::wrap_cuda_slice(out, cuda.clone());
        Ok(Tensor::from_storage(
            Storage::Cuda(storage),
            n,
            BackpropOp::none(),
            false,
        ))
    }

    /// Replaces each tensor with its view of `out`, in its original dtype.
    fn unpack(&self, out: &Tensor, tensors: &mut [Tensor]) -> Result<()> {
        let mut offset = 0;
        for (t, (n, dtype, shape)) in tensors.iter_mut().zip(&self.parts) {
            *t = out
                .narrow(0, offset, *n)?
                .reshape(shape)?
                .to_dtype(*dtype)?;
            offset += n;
        }
        Ok(())
    }
}

impl Communicator for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn all_reduce_sum(&self, tensors: &mut [Tensor], scalars: &mut [f64]) -> Result<()> {
        self.collective(tensors, scalars, Kind::Sum, "all-reduce")
    }
    fn broadcast(&self, tensors: &mut [Tensor], root: usize) -> Result<()> {
        if root >= self.world_size {
            return Err(Error::Distributed(DistributedError::CollectiveInput {
                detail: format!(
                    "broadcast root {root} is not a rank of a world of {}",
                    self.world_size
                ),
            }));
        }
        self.collective(tensors, &mut [], Kind::Broadcast(root), "broadcast")
    }
    fn barrier(&self) -> Result<()> {
        self.collective(&mut [], &mut [0.0], Kind::Sum, "barrier")
    }
    fn abort(&self) {
        self.abort_group();
    }
}

#[cfg(test)]
mod tests {
    //! What can be checked without a GPU (with the link stub, `Device::new_cuda`
    //! fails as on a machine without one). The collectives are checked on a GPU by
    //! `gpu_check nccl` and `tests/gpu.rs`.
    use super::*;

    /// A failed call keeps NCCL's answer as a typed source, shown once in a report.
    #[test]
    fn a_failed_call_keeps_ncclresult_as_its_source() {
        let err =
            nccl_err("ncclAllReduce")(nccl::NcclError(nccl_sys::ncclResult_t::ncclInvalidArgument));
        let mut cause = std::error::Error::source(&err);
        let mut failure = None;
        while let Some(source) = cause {
            failure = failure.or(source.downcast_ref::<NcclFailure>());
            cause = source.source();
        }
        let failure = failure.expect("the NCCL failure, typed, among the causes");
        assert_eq!(failure.result, "ncclInvalidArgument");
        let report = err.report();
        assert_eq!(report.matches("ncclInvalidArgument").count(), 1, "{report}");
        assert!(report.contains("NCCL ncclAllReduce: failed"), "{report}");
    }

    #[test]
    fn one_gpu_per_rank() {
        assert!(check_distinct(&[0, 1, 2]).is_ok());
        let dup = check_distinct(&[0, 1, 0]).unwrap_err().to_string();
        assert!(
            dup.contains("cuda:0") && dup.contains("one GPU per rank"),
            "{dup}"
        );
    }

    #[test]
    fn unique_ids_must_have_128_bytes() {
        let id = unique_id(&[7u8; 128]).unwrap();
        assert!(id.internal.iter().all(|&c| c as u8 == 7));
        assert!(matches!(
            unique_id(&[0u8; 127]),
            Err(Error::Distributed(DistributedError::CollectiveInput { .. }))
        ));
    }

    #[test]
    fn packing_round_trips_shapes_and_dtypes() {
        let dev = Device::Cpu;
        let a = Tensor::arange(0f32, 6.0, &dev)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        let b = Tensor::new(&[1.5f32, -2.0], &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let packed = Packed::new(&[a.clone(), b.clone()], &dev).unwrap().unwrap();
        assert_eq!(packed.dtype, DType::F32);
        assert_eq!(packed.flat.dims(), [8]);
        let mut back = [a.zeros_like().unwrap(), b.zeros_like().unwrap()];
        packed.unpack(&packed.flat, &mut back).unwrap();
        assert_eq!(back[0].dims(), [2, 3]);
        assert_eq!(back[1].dtype(), DType::BF16);
        assert_eq!(
            back[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
        assert_eq!(
            back[1]
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![1.5, -2.0]
        );
        // f64 (or an integer tensor) widens the buffer so nothing is rounded.
        let c = Tensor::new(&[123456789.125f64], &dev).unwrap();
        let wide = Packed::new(&[a, c], &dev).unwrap().unwrap();
        assert_eq!(wide.dtype, DType::F64);
        assert!(Packed::new(&[], &dev).unwrap().is_none());
    }

    #[test]
    fn non_cuda_devices_are_refused() {
        assert!(matches!(
            Nccl::group(&[Device::Cpu]),
            Err(Error::Distributed(DistributedError::Device { reason, .. })) if reason.contains("CUDA")
        ));
        assert!(matches!(
            Nccl::group(&[]),
            Err(Error::Settings(SettingsError::EmptyGroup))
        ));
    }

    #[test]
    fn without_a_gpu_group_creation_is_a_device_error() {
        if Device::new_cuda(0).is_ok() {
            eprintln!("skipping: a CUDA device is present");
            return;
        }
        assert!(matches!(
            Nccl::group_on(&[0]),
            Err(Error::Distributed(DistributedError::Device { .. }))
        ));
        assert!(matches!(
            Nccl::group_on(&[1, 1]),
            Err(Error::Distributed(DistributedError::Device { reason, .. })) if reason.contains("twice")
        ));
    }
}

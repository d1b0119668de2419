"""A small, friendly wrapper over the dlrm-server gRPC stubs.

Samples are plain Python sequences (lists, tuples, array.array); no numpy.
Every failed call raises DlrmError with the server's status code and message.
"""

import random
import threading
import time

import grpc

from dlrm import service_pb2
from dlrm import service_pb2_grpc

JobStatus = service_pb2.JobStatus

JOB_TERMINAL_STATES = frozenset(
    [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])


class DlrmError(Exception):
    """A failed RPC: `code` is a grpc.StatusCode, `message` the server's."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code.name, message))
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error):
        return cls(error.code(), error.details() or "")


def make_batch(dense, sparse, labels=None):
    """Builds a dlrm.Batch from row-major samples.

    dense: one sequence of floats per sample (already transformed, e.g.
      log(1 + x) for raw Criteo counts).
    sparse: one sequence per sample with one entry per table (in the model's
      table order); an entry is an id or a sequence of ids (a bag).
    labels: optional, one 0/1 per sample (needed to train or evaluate).
    Raises ValueError when the counts disagree.
    """
    size = len(dense)
    if len(sparse) != size:
        raise ValueError("dense has %d samples but sparse has %d" %
                         (size, len(sparse)))
    if labels is not None and len(labels) != size:
        raise ValueError("labels has %d values for %d samples" %
                         (len(labels), size))
    batch = service_pb2.Batch(size=size)
    num_tables = len(sparse[0]) if size else 0
    lengths = [[] for _ in range(num_tables)]
    ids = [[] for _ in range(num_tables)]
    flat_dense = []
    for s in range(size):
        flat_dense.extend(float(x) for x in dense[s])
        row = sparse[s]
        if len(row) != num_tables:
            raise ValueError("sample %d has %d sparse features, expected %d" %
                             (s, len(row), num_tables))
        for t, entry in enumerate(row):
            if isinstance(entry, int):
                lengths[t].append(1)
                ids[t].append(entry)
            else:
                lengths[t].append(len(entry))
                ids[t].extend(int(i) for i in entry)
    batch.dense.extend(flat_dense)
    for t in range(num_tables):
        batch.sparse.add(lengths=lengths[t], ids=ids[t])
    if labels is not None:
        batch.labels.extend(float(y) for y in labels)
    return batch


def random_batch(config, size, seed=0):
    """A random batch shaped for `config` (a dlrm.ModelConfig) with a planted,
    learnable rule: the label is 1 when dense[0] plus a per-id effect of the
    first table is positive. For examples and tests.
    """
    rng = random.Random(seed)
    num_dense = config.num_dense_features or 13
    dense, sparse, labels = [], [], []
    for _ in range(size):
        x = [rng.gauss(0.0, 1.0) for _ in range(num_dense)]
        row = []
        for table in config.tables:
            bag = max(table.multi_hot_size, 1)
            n = rng.randint(1, bag) if bag > 1 else 1
            ids = [rng.randrange(table.rows) for _ in range(n)]
            row.append(ids if bag > 1 else ids[0])
        first = row[0] if row else 0
        first_id = first if isinstance(first, int) else first[0]
        effect = 1.0 if first_id % 2 == 0 else -1.0
        dense.append(x)
        sparse.append(row)
        labels.append(1 if x[0] + effect > 0 else 0)
    return make_batch(dense, sparse, labels)


def synthetic_dataset(num_samples, zipf_alpha=0.0, teacher_seed=0,
                      sample_seed=0):
    """A DatasetSpec for data the server generates (0 = the server's
    defaults; num_samples 0 is endless)."""
    return service_pb2.DatasetSpec(synthetic=service_pb2.SyntheticData(
        num_samples=num_samples, zipf_alpha=zipf_alpha,
        teacher_seed=teacher_seed, sample_seed=sample_seed))


def criteo_dataset(paths, hash_ids=False):
    """A DatasetSpec for Criteo TSV files on the server."""
    return service_pb2.DatasetSpec(criteo_tsv=service_pb2.CriteoFiles(
        paths=list(paths), hash_ids=hash_ids))


def binary_dataset(path):
    """A DatasetSpec for one binary Criteo file on the server."""
    return service_pb2.DatasetSpec(criteo_binary=path)


def _read_file(path):
    with open(path, "rb") as f:
        return f.read()


class _BearerToken(grpc.UnaryUnaryClientInterceptor,
                   grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call. Metadata rather
    than call credentials: gRPC refuses those on a plaintext channel."""

    def __init__(self, token):
        self._metadata = ("authorization", "Bearer " + token)

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


class Client:
    """A connection to one dlrm-server. Thread-safe like a grpc.Channel."""

    def __init__(self, address="127.0.0.1:50051", connect_timeout=10.0,
                 max_message_bytes=256 << 20, call_timeout=60.0, tls=False,
                 tls_ca=None, tls_cert=None, tls_key=None, auth_token=None):
        """Opens a channel, over TLS when tls is true or a tls_* file is
        given; waits up to connect_timeout seconds for the server (0 = do
        not wait) and raises DlrmError(UNAVAILABLE) if it does not answer.
        call_timeout bounds the quick unary calls (None or 0 = no deadline).
        tls_ca: PEM file of the CAs that sign the server's certificate
        (None = the system's roots); tls_cert, tls_key: PEM client
        certificate and key, for servers that require one. auth_token: the
        server's bearer token (see docs/server.md "Security")."""
        self.address = address
        self._call_timeout = call_timeout or None
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("give both tls_cert and tls_key, or neither")
        if tls or tls_ca or tls_cert:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(tls_ca) if tls_ca else None,
                private_key=_read_file(tls_key) if tls_key else None,
                certificate_chain=_read_file(tls_cert) if tls_cert else None)
            self._channel = grpc.secure_channel(address, credentials,
                                                options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        if connect_timeout:
            try:
                grpc.channel_ready_future(self._channel).result(
                    timeout=connect_timeout)
            except grpc.FutureTimeoutError:
                self._channel.close()
                raise DlrmError(
                    grpc.StatusCode.UNAVAILABLE,
                    "could not connect to dlrm-server at %s within %g s" %
                    (address, connect_timeout)) from None
        stub_channel = self._channel
        if auth_token:
            stub_channel = grpc.intercept_channel(self._channel,
                                                  _BearerToken(auth_token))
        self._trainer = service_pb2_grpc.TrainerStub(stub_channel)
        self._predictor = service_pb2_grpc.PredictorStub(stub_channel)
        self._admin = service_pb2_grpc.AdminStub(stub_channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise DlrmError.from_rpc_error(e) from None

    # ------------------------------------------------------------- Admin

    def info(self):
        """The dlrm.ModelInfo: config, parameter counts, steps, plan."""
        return self._call(self._admin.GetModelInfo,
                          service_pb2.ModelInfoRequest(), self._call_timeout)

    def config(self):
        """The server's dlrm.ModelConfig."""
        return self.info().config

    def metrics(self):
        """The server's metrics in the Prometheus text format."""
        return self._call(self._admin.GetMetrics, service_pb2.MetricsRequest(),
                          self._call_timeout).prometheus_text

    def save_checkpoint(self, path):
        """Saves to a directory on the server; the CheckpointResponse."""
        return self._call(self._admin.SaveCheckpoint,
                          service_pb2.CheckpointRequest(path=path))

    def restore_checkpoint(self, path):
        """Restores from a directory on the server."""
        return self._call(self._admin.RestoreCheckpoint,
                          service_pb2.CheckpointRequest(path=path))

    def export_weights(self, path):
        """Writes the weights as a safetensors file on the server (names in
        docs/server.md "Weights export"); the ExportResponse."""
        return self._call(self._admin.ExportWeights,
                          service_pb2.ExportRequest(path=path))

    # ----------------------------------------------------------- Trainer

    make_batch = staticmethod(make_batch)

    def train(self, batches, callback=None, max_in_flight=4):
        """Streams `batches` (dlrm.Batch messages, e.g. from make_batch) to
        the server, at most max_in_flight unanswered at a time. Calls
        callback(step_result) for each answer, in order, and returns the
        list of StepResults."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be positive")
        window = threading.Semaphore(max_in_flight)
        done = threading.Event()
        # gRPC iterates `batches` on its own thread and would report an
        # exception there only as a cancelled call; keep it to re-raise here.
        source_error = []

        def requests():
            try:
                for batch in batches:
                    while not window.acquire(timeout=0.1):
                        if done.is_set():
                            return
                    if done.is_set():
                        return
                    yield service_pb2.TrainRequest(batch=batch)
            except Exception as e:  # pylint: disable=broad-except
                source_error.append(e)

        results = []
        responses = self._trainer.Train(requests())
        try:
            for response in responses:
                window.release()
                results.append(response.result)
                if callback is not None:
                    callback(response.result)
        except grpc.RpcError as e:
            if source_error:
                raise source_error[0]
            raise DlrmError.from_rpc_error(e) from None
        finally:
            done.set()
            responses.cancel()
        if source_error:
            raise source_error[0]
        return results

    def start_job(self, train, eval_data=None, batch_size=0, epochs=0,
                  max_steps=0, eval_interval=0, eval_samples=0):
        """Starts a job on server datasets (see synthetic_dataset,
        criteo_dataset, binary_dataset) and returns its JobStatus; 0 means
        the server's default (2048 per step, 1 epoch, no step cap, eval at
        the end, all eval samples). One job or Train stream runs at a time:
        another raises DlrmError(FAILED_PRECONDITION)."""
        request = service_pb2.JobRequest(
            train=train, batch_size=batch_size, epochs=epochs,
            max_steps=max_steps, eval_interval=eval_interval,
            eval_samples=eval_samples)
        if eval_data is not None:
            request.eval.CopyFrom(eval_data)
        return self._call(self._trainer.StartJob, request, self._call_timeout)

    def get_job(self, job_id):
        return self._call(self._trainer.GetJob, service_pb2.JobId(id=job_id),
                          self._call_timeout)

    def cancel_job(self, job_id):
        return self._call(self._trainer.CancelJob,
                          service_pb2.JobId(id=job_id), self._call_timeout)

    def list_jobs(self):
        """The running job and the most recent finished ones, oldest first
        (a list of JobStatus)."""
        return list(self._call(self._trainer.ListJobs,
                               service_pb2.ListJobsRequest(),
                               self._call_timeout).jobs)

    def wait_job(self, job_id, poll_interval=0.5, timeout=None,
                 callback=None):
        """Polls until the job ends and returns its final JobStatus (check
        .state: SUCCEEDED, FAILED or CANCELLED). callback(status) sees every
        poll. Raises DlrmError(DEADLINE_EXCEEDED) after `timeout` seconds."""
        start = time.monotonic()
        while True:
            status = self.get_job(job_id)
            if callback is not None:
                callback(status)
            if status.state in JOB_TERMINAL_STATES:
                return status
            if timeout is not None and time.monotonic() - start >= timeout:
                raise DlrmError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "job %s still %s after %g s" %
                    (job_id, JobStatus.State.Name(status.state), timeout))
            time.sleep(poll_interval)

    def evaluate(self, batches=None, dataset=None, max_samples=0):
        """Evaluates on inline `batches` (labelled dlrm.Batch messages) or a
        server `dataset`; returns the EvaluateResponse (.metrics: auc,
        log_loss, accuracy, ctr, samples; .reference for synthetic data)."""
        request = service_pb2.EvaluateRequest(max_samples=max_samples)
        if batches is not None:
            request.batches.extend(batches)
        if dataset is not None:
            request.dataset.CopyFrom(dataset)
        return self._call(self._trainer.Evaluate, request)

    # --------------------------------------------------------- Predictor

    def predict(self, dense=None, sparse=None, batch=None):
        """Click probabilities, one float per sample, in order: of the
        samples given as make_batch takes them, or of a dlrm.Batch."""
        if batch is None:
            batch = make_batch(dense, sparse)
        else:
            # Labels are ignored by Predict; do not send them.
            batch = service_pb2.Batch(size=batch.size, dense=batch.dense,
                                      sparse=batch.sparse)
        response = self._call(self._predictor.Predict,
                              service_pb2.PredictRequest(batch=batch),
                              self._call_timeout)
        return list(response.probabilities)

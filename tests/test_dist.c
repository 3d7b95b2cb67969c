/* tests/test_dist.c - the data-parallel calls in a build without TFM_MPI: a group of one process, in
   which they must do what one process needs (nothing to exchange, the whole shard, the loss as given),
   check their arguments, and refuse a communicator. Runs with several processes are tests/test_mpi.c
   (make test-mpi). */

static tfm_config dist_cfg(void) {
    tfm_config c;
    memset(&c, 0, sizeof c);
    c.kind = TFM_MODEL_DECODER_LM;
    c.vocab_size = 8;
    c.d_model = 16;
    c.n_heads = 2;
    c.n_layers = 1;
    c.max_len = 6;
    c.max_batch = 2;
    c.seed = 3;
    return c;
}

static void test_dist_single(void) {
    tfm_dist d;
    tfm_model m;
    tfm_config c = dist_cfg();
    int32_t tok[12] = {1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4}, tgt[12] = {2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5};
    tfm_batch b;
    tfm_optim o;
    float x[3] = {1.5f, -2.0f, 4.0f}, gl = 0, loss = 0;
    double y[2] = {3.0, 4.0};
    int64_t b0 = -1, b1 = -1, gn = 0, n = 0;
    uint64_t s0 = 0, s1 = 0, s2 = 0;
    int dummy = 0;
    CHECK_ERR(tfm_dist_init(&d, &dummy, 0), TFM_E_ARG, "no TFM_MPI");
    CHECK_OK(tfm_dist_init(&d, NULL, 0));
    CHECK(d.rank == 0 && d.size == 1 && d.bucket == (int64_t)1 << 22);
    CHECK_OK(tfm_dist_allreduce(&d, x, 3, 1));
    CHECK(x[0] == 1.5f && x[1] == -2.0f && x[2] == 4.0f);
    CHECK_OK(tfm_dist_sum(&d, y, 2));
    CHECK(y[0] == 3.0 && y[1] == 4.0);
    CHECK_OK(tfm_dist_shard(&d, 7, &b0, &b1));
    CHECK(b0 == 0 && b1 == 7);
    CHECK_OK(tfm_dist_reduce_loss(&d, 2.5f, 10, &gl, &gn));
    CHECK(gl == 2.5f && gn == 10);
    CHECK_ERR(tfm_dist_reduce_loss(&d, 2.5f, -1, &gl, &gn), TFM_E_ARG, "tfm_dist_reduce_loss");
    CHECK_ERR(tfm_dist_shard(&d, -1, &b0, &b1), TFM_E_ARG, "tfm_dist_shard");
    CHECK_ERR(tfm_dist_sum(&d, NULL, 1), TFM_E_ARG, "tfm_dist_sum");
    CHECK_ERR(tfm_dist_broadcast_model(&d, NULL), TFM_E_ARG, "tfm_dist_broadcast_model");
    CHECK_ERR(tfm_dist_init(&d, NULL, (int64_t)1 << 31), TFM_E_ARG, "bucket");
    CHECK(d.size == 1); /* a failed init leaves the group as it was */

    CHECK_OK(tfm_model_init(&m, &c, NULL, 0));
    CHECK_OK(tfm_dist_broadcast_model(&d, &m));
    CHECK_OK(tfm_dist_check_model(&d, &m, &s0));
    CHECK_OK(tfm_dist_check_model(&d, &m, &s1));
    CHECK(s0 == s1 && s0 != 0);
    memset(&b, 0, sizeof b);
    b.batch = 2;
    b.len = 6;
    b.tokens = tok;
    b.targets = tgt;
    memset(&o, 0, sizeof o);
    o.lr = 1e-2f;
    tfm_model_zero_grad(&m);
    CHECK_OK(tfm_model_forward(&m, &b, &loss, &n));
    CHECK_OK(tfm_model_backward(&m, 1.0f));
    CHECK_OK(tfm_dist_allreduce_grads(&d, &m));
    CHECK_OK(tfm_model_step(&m, &o, NULL));
    CHECK_OK(tfm_dist_check_model(&d, &m, &s2));
    CHECK(s2 != s0); /* the checksum sees the update */
    CHECK_OK(tfm_dist_save(&d, &m, "build/dist_single.safetensors", TFM_SAVE_TRAINING_STATE, NULL, 0));
    {
        tfm_model m2;
        tfm_config c2 = c;
        uint64_t s3 = 0;
        c2.seed = 9;
        CHECK_OK(tfm_model_init(&m2, &c2, NULL, 0));
        CHECK_OK(tfm_dist_load(&d, &m2, "build/dist_single.safetensors"));
        CHECK_OK(tfm_dist_check_model(&d, &m2, &s3));
        CHECK(s3 == s2); /* parameters, moments, step and generator all came back */
        CHECK_ERR(tfm_dist_load(&d, &m2, "build/no_such_dir/x.safetensors"), TFM_E_IO, "tfm_model_load");
        /* tfm_dist_backward and tfm_dist_step are tfm_model_backward and tfm_model_step here: both models take
           the same step, to the bit */
        tfm_model_zero_grad(&m);
        tfm_model_zero_grad(&m2);
        CHECK_OK(tfm_model_forward(&m, &b, &loss, &n));
        CHECK_OK(tfm_model_backward(&m, 1.0f));
        CHECK_ERR(tfm_dist_backward(NULL, &m2, 1.0f), TFM_E_ARG, "tfm_dist_backward");
        CHECK_ERR(tfm_dist_backward(&d, &m2, 1.0f), TFM_E_ARG, "tfm_dist_backward: tfm_model_backward"); /* no forward yet */
        CHECK_OK(tfm_model_forward(&m2, &b, &loss, &n));
        CHECK_ERR(tfm_dist_backward(&d, &m2, NAN), TFM_E_ARG, "loss_scale");
        CHECK_OK(tfm_dist_backward(&d, &m2, 1.0f));
        CHECK_OK(tfm_model_step(&m, &o, NULL));
        CHECK_OK(tfm_dist_step(&d, &m2, &o, NULL));
        CHECK_OK(tfm_dist_check_model(&d, &m, &s2));
        CHECK_OK(tfm_dist_check_model(&d, &m2, &s3));
        CHECK(s3 == s2 && m2.step == 2);
        {   /* a bad opt is refused before anything changes */
            tfm_optim bad = o;
            uint64_t s4 = 0;
            bad.lr = 0.0f;
            CHECK_ERR(tfm_dist_step(&d, &m2, &bad, NULL), TFM_E_ARG, "tfm_dist_step");
            CHECK_OK(tfm_dist_check_model(&d, &m2, &s4));
            CHECK(s4 == s3 && m2.step == 2);
        }
        tfm_model_free(&m2);
    }
    { /* moments sharded for two ranks: a group of one is not that group */
        tfm_model z;
        tfm_config cz = c;
        size_t whole = 0, half = 0;
        cz.moment_shards = 2;
        cz.moment_shard = 1;
        CHECK_OK(tfm_model_memory_size(&c, &whole));
        CHECK_OK(tfm_model_memory_size(&cz, &half));
        CHECK(half < whole);
        CHECK_OK(tfm_model_init(&z, &cz, NULL, 0));
        CHECK_ERR(tfm_dist_step(&d, &z, &o, NULL), TFM_E_ARG, "rank 0 of 1");
        CHECK_ERR(tfm_model_step(&z, &o, NULL), TFM_E_ARG, "tfm_dist_step");
        tfm_model_free(&z);
    }
    tfm_model_free(&m);
    tfm_dist_free(&d);
    CHECK_ERR(tfm_dist_allreduce(&d, x, 3, 0), TFM_E_ARG, "not initialised");
    CHECK_ERR(tfm_dist_shard(NULL, 3, &b0, &b1), TFM_E_ARG, "d is NULL");
}

static void suite_dist(void) { test__run("dist: a group of one without TFM_MPI", test_dist_single); }

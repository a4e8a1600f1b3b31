// An edgekit QNN HTP variant (context binaries) in an Android app, through ONNX Runtime
// GenAI's Java API with the QNN execution provider plug-in.
//
// NOT COMPILED AND NOT RUN ON A PHONE: written on an x86_64 host without Android tooling.
// Class and method names are checked against onnxruntime-genai's Java sources
// (src/java/src/main/java/ai/onnxruntime/genai/) and onnxruntime-qnn's Android test
// (java/src/test/android/); see README.md beside this file for the dependencies, the
// files the app copies out of the variant folder and what the pipeline requires.

package com.example.edgekit

import ai.onnxruntime.OrtEnvironment
import ai.onnxruntime.genai.Config
import ai.onnxruntime.genai.Generator
import ai.onnxruntime.genai.Model
import ai.onnxruntime.genai.Tokenizer
import ai.onnxruntime.qnnpluginep.getEpName
import ai.onnxruntime.qnnpluginep.getLibraryPath
import android.content.Context
import android.system.Os

object EdgekitHtp {
    @Volatile private var registered = false

    /** Once per process, before the first Model: where the QNN plug-in and the HTP's
     *  DSP-side (Skel) libraries are. Whether ONNX Runtime GenAI sees a registration made
     *  on OrtEnvironment depends on both using the app's one libonnxruntime.so (README,
     *  "Registering the QNN provider library"): not checked on a device. */
    @Synchronized
    fun prepare(context: Context) {
        if (registered) return
        val nativeDir = context.applicationInfo.nativeLibraryDir
        Os.setenv("ADSP_LIBRARY_PATH", nativeDir, true)
        OrtEnvironment.getEnvironment().registerExecutionProviderLibrary(getEpName(), getLibraryPath())
        registered = true
    }

    /** Greedy reply to [chatPrompt] (already rendered with the variant's chat template:
     *  the pipeline takes the whole conversation in one appendTokens, one Generator per
     *  reply). [modelDir] holds genai_config.json, embeddings.onnx, the part*_ctx.onnx
     *  wrappers, their .bin binaries and the tokenizer files, side by side. */
    fun generate(modelDir: String, chatPrompt: String, maxNew: Int, onText: (String) -> Unit) {
        // genai_config.json already names the QNN provider and its options for every part
        // stage (backend_type htp, soc_model, htp_arch, ...): nothing to set here.
        Config(modelDir).use { config ->
            Model(config).use { model ->
                Tokenizer(model).use { tokenizer ->
                    val prompt = tokenizer.encode(chatPrompt).use { it.getSequence(0) }
                    model.createGeneratorParams().use { params ->
                        // the KV buffers are static: prompt + reply must fit the variant's
                        // context_length (genai_config.json), which the caller checks
                        params.setSearchOption("max_length", (prompt.size + maxNew).toDouble())
                        params.setSearchOption("do_sample", false)
                        Generator(model, params).use { generator ->
                            generator.appendTokens(prompt)
                            tokenizer.createStream().use { stream ->
                                while (!generator.isDone()) {
                                    generator.generateNextToken()
                                    onText(stream.decode(generator.getLastTokenInSequence(0)))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
